"""CTC output layers (one per target kind), the CTC loss, greedy decoding and prefix beam search.

Blank is token 0 in every vocabulary (asr.data.splits.tokenizers.BLANK_ID).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from asr.data.splits.tokenizers import BLANK_ID


class CTCHeads(nn.Module):
    """One linear layer per target kind, encoder states -> log-probabilities over its vocabulary.

    `vocab_sizes` maps a kind ("phones", "chars", "sentencepiece") to its vocabulary size
    including blank; the order of the mapping is kept (the first kind is the primary one).
    """

    def __init__(self, d_model: int, vocab_sizes: dict[str, int]):
        super().__init__()
        if not vocab_sizes:
            raise ValueError("a CTC model needs at least one target kind (data.targets is empty)")
        self.projections = nn.ModuleDict({kind: nn.Linear(d_model, size) for kind, size in vocab_sizes.items()})

    @property
    def kinds(self) -> list[str]:
        return list(self.projections.keys())

    def forward(self, states: torch.Tensor) -> dict[str, torch.Tensor]:
        """(B, T, D) -> {kind: (B, T, V_kind) log-probabilities}."""
        return {kind: F.log_softmax(proj(states).float(), dim=-1) for kind, proj in self.projections.items()}


def ctc_loss(log_probs: torch.Tensor, lengths: torch.Tensor,
             targets: torch.Tensor, target_lengths: torch.Tensor) -> torch.Tensor:
    """Mean over the batch of each utterance's CTC loss divided by its target length.

    (B, T, V) log-probs, (B,) lengths, (B, S) targets padded with anything, (B,) target lengths.
    `zero_infinity`: an utterance that cannot be aligned (more targets than frames) contributes
    0 instead of inf, so one bad utterance cannot poison a batch; the data module filters those
    out beforehand and says how many.
    """
    return F.ctc_loss(log_probs.transpose(0, 1), targets, lengths, target_lengths,
                      blank=BLANK_ID, reduction="mean", zero_infinity=True)


def greedy_decode(log_probs: torch.Tensor, lengths: torch.Tensor) -> list[list[int]]:
    """Best path decoding: argmax per frame, merge repeats, drop blanks.

    (B, T, V) scores (any monotone transform of probabilities), (B,) valid lengths ->
    one list of token ids per utterance. Frames past an utterance's length are ignored.
    """
    best = log_probs.argmax(dim=-1).cpu()
    decoded = []
    for path, length in zip(best, lengths.cpu().tolist()):
        path = path[:length]
        if length == 0:
            decoded.append([])
            continue
        keep = torch.ones_like(path, dtype=torch.bool)
        keep[1:] = path[1:] != path[:-1]          # first frame of every run
        keep &= path != BLANK_ID
        decoded.append(path[keep].tolist())
    return decoded


def prefix_beam_search(log_probs: torch.Tensor, length: int, beam_size: int = 8) -> list[int]:
    """CTC prefix beam search (no language model) of one utterance: the labelling whose
    probability, summed over all its alignments, is highest among the `beam_size` prefixes
    kept after every frame.

    (T, V) log-probabilities, the utterance's valid length -> token ids. Every kept prefix
    carries two log-probabilities, of its alignments ending in blank and ending in its last
    token, so a repeated token needs a blank between its two copies (as CTC defines). With a
    beam at least as large as the number of distinct prefixes this is the exact most probable
    labelling; a beam of 1 is close to, but not always the same as, greedy best-path decoding.
    """
    if beam_size < 1:
        raise ValueError(f"beam_size={beam_size} must be >= 1")
    frames = log_probs[:length].double().cpu()
    vocabulary = frames.shape[-1]
    neg_inf = float("-inf")
    # prefix -> (log p ending in blank, log p ending in the prefix's last token)
    beams: dict[tuple[int, ...], tuple[float, float]] = {(): (0.0, neg_inf)}
    for frame in frames:
        scores = frame.tolist()
        # Only tokens that could matter: the beam's best extensions come from the frame's top tokens.
        candidates = sorted(range(vocabulary), key=scores.__getitem__, reverse=True)[:beam_size + 1]
        extended: dict[tuple[int, ...], list[float]] = {}

        def add(prefix, blank, token):
            entry = extended.setdefault(prefix, [neg_inf, neg_inf])
            entry[0] = _log_add(entry[0], blank)
            entry[1] = _log_add(entry[1], token)

        for prefix, (blank, token) in beams.items():
            total = _log_add(blank, token)
            add(prefix, total + scores[BLANK_ID], neg_inf)                 # stay, via blank
            if prefix:
                add(prefix, neg_inf, token + scores[prefix[-1]])          # stay, repeating the last token
            for symbol in candidates:
                if symbol == BLANK_ID:
                    continue
                if prefix and symbol == prefix[-1]:
                    # a new copy of the last token only after a blank
                    add(prefix + (symbol,), neg_inf, blank + scores[symbol])
                else:
                    add(prefix + (symbol,), neg_inf, total + scores[symbol])
        best = sorted(extended.items(), key=lambda item: _log_add(*item[1]), reverse=True)[:beam_size]
        beams = {prefix: (blank, token) for prefix, (blank, token) in best}
    return list(max(beams.items(), key=lambda item: _log_add(*item[1]))[0])


def _log_add(a: float, b: float) -> float:
    if a == float("-inf"):
        return b
    if b == float("-inf"):
        return a
    high, low = (a, b) if a > b else (b, a)
    return high + math.log1p(math.exp(low - high))


# The decoders asr.evaluate and asr.transcribe choose from by name (decoder=...); a new decoder is
# one more name here and one more branch in decode_transcripts, and both commands have it.
DECODERS = ("greedy", "beam")


def decode_transcripts(log_probs: torch.Tensor, lengths: torch.Tensor, tokenizer, decoder: str = "greedy",
                       beam_size: int = 8) -> list[str]:
    """(B, T, V) log-probs of one head, (B,) lengths -> one transcript per utterance, decoded by the
    decoder named `decoder` (one of DECODERS) and turned into text by the head's `tokenizer`."""
    if decoder == "greedy":
        ids = greedy_decode(log_probs, lengths)
    elif decoder == "beam":
        ids = [prefix_beam_search(row, int(n), beam_size) for row, n in zip(log_probs, lengths)]
    else:
        raise ValueError(f"decoder={decoder!r}; choose one of {', '.join(DECODERS)}")
    return [tokenizer.decode(x) for x in ids]
