"""parse_attention_spec: the short attention specs of the benchmark and the ASR tools."""
import pytest
import torch

from attention_ext import AttentionConfigError, available_attentions, parse_attention_spec, validate_attention
from attention_ext import registry
from attention_ext.registry import Option, register_attention


@pytest.fixture
def paper_registry(monkeypatch):
    """A registry holding stand-ins with the options (and paper defaults), number options and
    aliases of the real types, so the grammar is tested whether or not the real modules are written yet."""
    monkeypatch.setattr(registry, "_REGISTRY", {})
    clustering = (Option("clusters", 100, 1), Option("bits", 63, 1, 63), Option("iterations", 10, 0))
    kinds = {
        "full": ((), {}),
        "shared_full": ((), {}),
        "clustered": (clustering, {"number_option": "clusters"}),
        "iclustered": (clustering + (Option("topk", 32, 1),),
                       {"number_option": "clusters", "aliases": ("i-clustered", "improved-clustered")}),
        "lsh": ((Option("rounds", 1, 1), Option("chunk_size", 32, 1)), {"number_option": "rounds"}),
        "oracle_top": ((Option("topk", 32, 1),), {"number_option": "topk"}),
    }
    for name, (options, facts) in kinds.items():
        register_attention(name, options, **facts)(type(f"StandIn_{name}", (torch.nn.Module,), {}))


@pytest.mark.parametrize("spec,name,options", [
    ("full", "full", {}),
    (" Full ", "full", {}),
    ("shared-full", "shared_full", {}),
    ("shared_full", "shared_full", {}),
    ("lsh", "lsh", {"rounds": 1, "chunk_size": 32}),
    ("lsh-4", "lsh", {"rounds": 4, "chunk_size": 32}),
    ("LSH_1", "lsh", {"rounds": 1, "chunk_size": 32}),
    ("lsh-4:chunk_size=64", "lsh", {"rounds": 4, "chunk_size": 64}),
    ("clustered", "clustered", {"clusters": 100, "bits": 63, "iterations": 10}),
    ("clustered-25", "clustered", {"clusters": 25, "bits": 63, "iterations": 10}),
    ("clustered-100:bits=32, iterations=5", "clustered", {"clusters": 100, "bits": 32, "iterations": 5}),
    ("i-clustered-200", "iclustered", {"clusters": 200, "bits": 63, "iterations": 10, "topk": 32}),
    ("iclustered-200", "iclustered", {"clusters": 200, "bits": 63, "iterations": 10, "topk": 32}),
    ("improved-clustered", "iclustered", {"clusters": 100, "bits": 63, "iterations": 10, "topk": 32}),
    ("i-clustered-100:topk=16", "iclustered", {"clusters": 100, "bits": 63, "iterations": 10, "topk": 16}),
    ("oracle-top", "oracle_top", {"topk": 32}),
    ("oracle_top", "oracle_top", {"topk": 32}),
    ("oracle-top-16", "oracle_top", {"topk": 16}),
    ("oracle_top:topk=8", "oracle_top", {"topk": 8}),
])
def test_spec_forms(paper_registry, spec, name, options):
    assert parse_attention_spec(spec) == (name, options)


@pytest.mark.parametrize("spec,message", [
    ("bogus", "unknown attention spec 'bogus'"),
    ("", "unknown attention spec ''"),
    ("lsh4", "unknown attention spec 'lsh4'"),
    ("clustered-100x", "unknown attention spec"),
    ("full-3", "'full' takes no number"),
    ("shared-full-2", "'shared_full' takes no number"),
    ("lsh-4:chunk_size", "not option=<integer>"),
    ("lsh-4:chunk_size=big", "not option=<integer>"),
    ("lsh-4:rounds=2", "option rounds is given twice"),
])
def test_bad_specs_list_the_accepted_forms(paper_registry, spec, message):
    with pytest.raises(AttentionConfigError) as error:
        parse_attention_spec(spec)
    text = str(error.value)
    assert message in text
    if "takes no number" in message or "unknown" in message or "option=" in message:
        for form in ("full", "shared_full", "clustered-<clusters>", "iclustered-<clusters>",
                     "i-clustered", "lsh-<rounds>", "oracle_top-<topk>"):
            assert form in text, form


@pytest.mark.parametrize("spec,message", [
    ("clustered-0", "clusters=0 is out of range"),
    ("clustered-100:bits=64", "bits=64 is out of range"),
    ("lsh:chunk=3", "has no option chunk"),
])
def test_option_errors_come_from_the_registry_rules(paper_registry, spec, message):
    with pytest.raises(AttentionConfigError, match=message):
        parse_attention_spec(spec)


def test_real_registry_names_parse_to_their_defaults():
    for name in available_attentions():
        assert parse_attention_spec(name) == validate_attention(name)
        assert parse_attention_spec(name.replace("_", "-")) == validate_attention(name)


def test_real_clustered_spec_has_the_paper_settings():
    if "clustered" not in available_attentions():
        pytest.skip("clustered is not registered")
    assert parse_attention_spec("clustered-100") == (
        "clustered", {"clusters": 100, "bits": 63, "iterations": 10})


def test_registration_refuses_a_number_option_it_lacks_and_a_taken_alias(paper_registry):
    def stand_in():
        return type("StandIn_other", (torch.nn.Module,), {})
    with pytest.raises(RuntimeError, match="number_option 'rounds' is none of its options"):
        register_attention("other", (Option("topk", 1, 1),), number_option="rounds")(stand_in())
    with pytest.raises(RuntimeError, match="'I-Clustered' already names an attention"):
        register_attention("other", aliases=("I-Clustered",))(stand_in())
    with pytest.raises(RuntimeError, match="'shared-full' already names an attention"):
        register_attention("other", aliases=("shared-full",))(stand_in())
    assert "other" not in available_attentions()
