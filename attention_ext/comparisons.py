"""Which attentions each comparison of the project shows, and in which order: declared once,
here beside the registry, and read by every comparison.

    comparison                                 declared by               read by
    benchmark (Fig. 4, supplementary C.1)      benchmark_attentions()    attention_ext.benchmarks.speed: the default
                                                                         --attentions and the further
                                                                         attentions' targets (targets.py)
    masked copy task (Fig. 5, suppl. C.2)      copy_task_attentions(C)   attention_ext.benchmarks.copy_task: the default
                                                                         --attentions
    train-with x evaluate-with (Table 1)       cross_matrix_rows(S, L)   asr.cross_matrix's default --specs,
                                                                         recipes/synth/experiment_settings.py's rows

Every comparison first shows the paper's attentions as the paper's figure or table does: those
rows are the paper's, so they are written out here. Then come the further attentions: every
attention registered with `compare_as` (`register_attention(..., compare_as="agglomerative-8")`),
in the registry's order (the order they joined the project: linear, then agglomerative-8). So a
new attention joins every comparison by declaring `compare_as` on its registration; neither this
file nor any comparison's own file changes.

The lists are computed when asked for, not when this module is imported, so they hold every
attention registered by then (a test's or a user's too).
"""
from __future__ import annotations

from collections.abc import Iterable

from .registry import available_attentions


def further_attentions() -> tuple[str, ...]:
    """The specs of the attentions registered with compare_as, in registry order: this project's
    attentions beyond the paper's ("linear", "agglomerative-8")."""
    return tuple(entry.compare_as for entry in available_attentions().values() if entry.compare_as is not None)


def benchmark_attentions() -> tuple[str, ...]:
    """Supplementary C.1 / Fig. 4: full; clustered with 100 clusters (63 bits and 10 Lloyd
    iterations are the registry's defaults, so the short spec suffices; the run's header prints
    the full options); i-clustered the same with top-32 keys; Reformer with 1 and 4 hashing
    rounds; then the further attentions (not in the paper's figure)."""
    return ("full", "clustered-100", "i-clustered-100", "lsh-1", "lsh-4") + further_attentions()


def copy_task_attentions(clusters: Iterable[int | str]) -> tuple[str, ...]:
    """Supplementary C.2 / Fig. 5: full, clustered and i-clustered with every cluster count of
    `clusters`, Reformer with one round, then the further attentions."""
    clusters = list(clusters)
    return ("full", *(f"clustered-{count}" for count in clusters),
            *(f"i-clustered-{count}" for count in clusters), "lsh-1") + further_attentions()


def cross_matrix_rows(small: int = 100, large: int = 200) -> tuple[str, ...]:
    """Table 1's evaluate-with rows with its two cluster counts (100 and 200; a corpus of shorter
    sequences scales them down), then the further attentions (no finding of the paper rests on
    them)."""
    return ("full", "shared-full", "lsh-1", "lsh-4", f"clustered-{small}", f"clustered-{large}",
            f"i-clustered-{small}", f"i-clustered-{large}", "oracle-top") + further_attentions()
