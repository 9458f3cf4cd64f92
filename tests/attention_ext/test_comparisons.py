"""The comparison lists (attention_ext.comparisons): declared once, read by every comparison, and
the same rows in the same order as when each comparison kept its own list.

The lists of today's attentions are written out below as they stood in the comparisons' own files
before they were declared in one place; a test holds every reader to them. An attention added later
with compare_as may only append rows, so these tests need no edit when one is added.
"""
import pytest

from attention_ext import FullAttention, Option, parse_attention_spec, register_attention, registry
from attention_ext.comparisons import (benchmark_attentions, copy_task_attentions, cross_matrix_rows,
                                       further_attentions)

# The lists as the comparisons' files held them (asr/cross_matrix.py DEFAULT_SPECS,
# recipes/synth/experiment.py Setting.specs, benchmark/cases.py DEFAULT_ATTENTIONS,
# copy_task/__main__.py default_specs) before this module declared them.
CROSS_MATRIX_ROWS = ("full", "shared-full", "lsh-1", "lsh-4", "clustered-100", "clustered-200", "i-clustered-100",
                     "i-clustered-200", "oracle-top", "linear", "agglomerative-8")
SYNTH_SHORT_ROWS = ("full", "shared-full", "lsh-1", "lsh-4", "clustered-32", "clustered-64", "i-clustered-32",
                    "i-clustered-64", "oracle-top", "linear", "agglomerative-8")
BENCHMARK_ATTENTIONS = ("full", "clustered-100", "i-clustered-100", "lsh-1", "lsh-4", "linear", "agglomerative-8")
COPY_TASK_ATTENTIONS = ("full", "clustered-4", "clustered-8", "clustered-16", "clustered-32", "i-clustered-4",
                        "i-clustered-8", "i-clustered-16", "i-clustered-32", "lsh-1", "linear", "agglomerative-8")
TODAYS_ATTENTIONS = {"full", "shared_full", "lsh", "oracle_top", "clustered", "iclustered", "linear",
                     "agglomerative"}


def assert_todays_rows_then_only_new_ones(rows, todays):
    """`rows` starts with `todays`, in that order, and whatever follows is an attention added since."""
    rows = tuple(rows)
    assert rows[:len(todays)] == todays
    later = [spec for spec in rows[len(todays):] if parse_attention_spec(spec).name in TODAYS_ATTENTIONS]
    assert later == [], f"rows of today's attentions after agglomerative-8: {later}"


def test_the_declared_lists_hold_todays_rows_in_todays_order():
    assert further_attentions()[:2] == ("linear", "agglomerative-8")
    assert_todays_rows_then_only_new_ones(cross_matrix_rows(), CROSS_MATRIX_ROWS)
    assert_todays_rows_then_only_new_ones(cross_matrix_rows(32, 64), SYNTH_SHORT_ROWS)
    assert_todays_rows_then_only_new_ones(benchmark_attentions(), BENCHMARK_ATTENTIONS)
    assert_todays_rows_then_only_new_ones(copy_task_attentions([4, 8, 16, 32]), COPY_TASK_ATTENTIONS)


def test_every_comparison_reads_the_declared_list():
    from asr.cross_matrix import DEFAULT_SPECS, build_parser as cross_matrix_parser
    from attention_ext.benchmarks.speed.__main__ import build_parser as benchmark_parser
    from attention_ext.benchmarks.copy_task.__main__ import DEFAULT_CLUSTERS, default_specs
    from recipes.synth.experiment_settings import SETTINGS

    assert DEFAULT_SPECS == cross_matrix_rows()
    assert cross_matrix_parser().parse_args(["a.ckpt"]).specs == list(cross_matrix_rows())
    assert SETTINGS["paper"].specs == cross_matrix_rows(100, 200)
    assert SETTINGS["short"].specs == cross_matrix_rows(32, 64)
    assert_todays_rows_then_only_new_ones(SETTINGS["short"].specs, SYNTH_SHORT_ROWS)
    assert benchmark_parser().parse_args([]).attentions == list(benchmark_attentions())
    assert default_specs(list(DEFAULT_CLUSTERS)) == list(copy_task_attentions(DEFAULT_CLUSTERS))


def test_the_further_attentions_keep_their_benchmark_targets():
    """linear's and agglomerative-8's targets (issue 17) as targets.py listed them by hand."""
    from attention_ext.benchmarks.speed.targets import LINEAR_SCALING_TARGETS, SPEEDUP_TARGETS
    speedups = [(t.name, t.options, t.length, t.minimum, t.title) for t in SPEEDUP_TARGETS]
    assert speedups[:6] == [
        ("clustered", (), 4096, 30.0, "clustered"), ("iclustered", (), 4096, 18.0, "iclustered"),
        ("lsh", (("rounds", 1),), 4096, 30.0, "lsh-1"), ("lsh", (("rounds", 4),), 4096, 3.0, "lsh-4"),
        ("linear", (), 4096, 12.0, "linear"), ("agglomerative", (("classes", 8),), 4096, 12.0, "agglomerative-8")]
    scaling = [(t.name, t.options, t.shortest, t.longest, t.factor, t.title, t.quantity)
               for t in LINEAR_SCALING_TARGETS]
    assert scaling[6:8] == [("linear", (), 2048, 8192, 1.3, "linear", "time"),
                            ("agglomerative", (("classes", 8),), 2048, 8192, 1.3, "agglomerative-8", "time")]
    assert [t.title for t in SPEEDUP_TARGETS[4:]] == list(further_attentions())


# A name no real attention takes, so these tests also run where one more attention is registered.
NAME = "scratch_compared"


class ScratchAttention(FullAttention):
    """Full attention under another name, with one option."""

    def __init__(self, width: int = 3):
        super().__init__()


@pytest.fixture
def scratch_registry(monkeypatch):
    """The registry as it is, in a copy that is thrown away afterwards."""
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry.available_attentions()))


def cross_matrix_rows_of(further: tuple[str, ...]) -> tuple[str, ...]:
    """Table 1's rows (100 and 200 clusters) followed by `further`."""
    return CROSS_MATRIX_ROWS[:9] + further


def test_a_new_attention_with_compare_as_joins_every_comparison_at_the_end(scratch_registry):
    before = further_attentions()
    register_attention(NAME, (Option("width", 3, 1),), number_option="width",
                       compare_as=f"{NAME}-5")(ScratchAttention)
    assert further_attentions() == before + (f"{NAME}-5",)
    assert cross_matrix_rows() == cross_matrix_rows_of(before) + (f"{NAME}-5",)
    assert benchmark_attentions()[-1] == copy_task_attentions([4])[-1] == f"{NAME}-5"
    assert parse_attention_spec(further_attentions()[-1]).options == {"width": 5}


def test_an_attention_without_compare_as_is_in_no_comparison(scratch_registry):
    register_attention(NAME)(ScratchAttention)
    assert NAME not in " ".join(cross_matrix_rows() + benchmark_attentions() + copy_task_attentions([2]))


@pytest.mark.parametrize("compare_as,message", [
    (f"{NAME}-x", f"compare_as '{NAME}-x' is not a valid spec"),
    ("full", f"compare_as 'full' names 'full', not '{NAME}'"),
    (f"{NAME}:size=2", f"compare_as '{NAME}:size=2' is not a valid spec"),
])
def test_a_wrong_compare_as_fails_at_registration_and_registers_nothing(scratch_registry, compare_as, message):
    with pytest.raises(RuntimeError, match=message):
        register_attention(NAME, compare_as=compare_as)(ScratchAttention)
    assert NAME not in registry.available_attentions()
