"""The two settings of ``recipes.synth.experiment``: what each changes in asr.train for every preset
(sequence length, the clustered presets' cluster count, the step budget) and the matrix's rows."""
from __future__ import annotations

from dataclasses import dataclass

from attention_ext.comparisons import cross_matrix_rows

PRESETS = ("synth_full", "synth_shared_full", "synth_lsh1", "synth_lsh4", "synth_clustered",
           "synth_iclustered")
CLUSTERED_PRESETS = ("synth_clustered", "synth_iclustered")


@dataclass(frozen=True)
class Setting:
    """What one setting changes: asr.train overrides for every preset, the cluster count the
    clustered presets train with, and the matrix's two cluster counts (Table 1's 100 and 200)."""
    description: str
    overrides: tuple[str, ...]
    train_clusters: int
    small: int
    large: int
    steps: int

    @property
    def specs(self) -> tuple[str, ...]:
        """Table 1's rows, then this project's further linear-cost attentions (no finding rests on them;
        declared in attention_ext.comparisons)."""
        return cross_matrix_rows(self.small, self.large)

    def preset_overrides(self, preset: str) -> list[str]:
        clusters = [f"attention.clusters={self.train_clusters}"] if preset in CLUSTERED_PRESETS else []
        return [*self.overrides, *clusters]


SETTINGS = {
    # ~780 encoder positions: utterances twice as long (~16 s, `synth_corpus.utterance_scale=2`, generated
    # into their own folder on first use; 1500 of them are the same 6.5 hours as the 3000 of the short
    # setting) and the presets' stride-2 convolutional front end. The front end's local context is what
    # makes CTC leave its blank plateau early: with the paper's linear front end (no subsampling on the
    # ~8 s utterances) full attention was still at 54 % PER after 1500 steps (RESULTS.md). A batch holds
    # the same 60 s of audio as in the short setting, so a step costs the same linear layers and twice
    # the attention.
    "paper": Setting("the paper's length: ~780 encoder positions (16 s utterances, stride-2 front end), "
                     "100/200 clusters",
                     ("data.root=data/synth_x2", "synth_corpus.utterance_scale=2", "synth_corpus.train_utterances=1500",
                      "trainer.val_check_interval=200", "trainer.diagnostics_every_n_steps=50"),
                     train_clusters=100, small=100, large=200, steps=1500),
    "short": Setting("the synth presets: ~390 encoder positions, 32/64 clusters",
                     ("trainer.val_check_interval=200", "trainer.diagnostics_every_n_steps=50"),
                     train_clusters=64, small=32, large=64, steps=1600),
}
DEFAULT_SETTING = "paper"
SPECS = SETTINGS["short"].specs      # the rows of the short setting (the tests' hand-made matrix)
SMALL, LARGE = SETTINGS["short"].small, SETTINGS["short"].large


def training_spec(column: str, setting: Setting) -> str:
    """The attention spec a column's preset trains with (its diagonal row), e.g. iclustered ->
    i-clustered-100 in the paper setting."""
    clusters = setting.train_clusters
    return {"full": "full", "shared_full": "shared-full", "lsh1": "lsh-1", "lsh4": "lsh-4",
            "clustered": f"clustered-{clusters}", "iclustered": f"i-clustered-{clusters}"}.get(column, column)
