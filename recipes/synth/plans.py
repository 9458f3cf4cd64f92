"""The plan of every utterance of the synthetic corpus: its sentences, speaker and voicing, drawn
before any synthesis (``recipes.synth.prepare`` synthesises the plans and writes the corpus).

- Sentences: the shipped WordNet list is shuffled with the seed and cut 90/5/5 % into train, dev
  and test pools, so no sentence is in two splits. An utterance joins 2-4 consecutive sentences
  of its split's pool until it reaches a drawn target of 14-30 words (about 5-10 s of speech);
  ``--utterance-scale K`` multiplies both ranges (K=2: 4-8 sentences, 28-60 words, about 16 s).
  A split that asks for more sentences than its pool holds goes round the pool again in a new
  order (sentences repeat within that split, never across splits).
- Speakers: train and dev use the 32 seen speakers (a quarter of the utterances flite, three
  quarters espeak-ng); half of the test utterances use the held-out speakers, the other half
  the seen ones. See ``recipes.synth.voices``.
- Extra voices (``--extra-voices festival``; off by default): a third of the seen espeak-ng
  utterances get one of festival's 3 US English voices instead, so festival speaks a quarter of
  the seen-speaker utterances (espeak-ng a half, flite a quarter) in every split; all festival
  voices are seen ones. The choice and the festival voicing come from a random stream of their own
  (``default_rng((seed, split, i, 1))``), so every other part of a plan (sentences, gain, and the
  speaker of the other utterances) is the default plan's: the held-out half of the test split and
  three quarters of the rest are the same utterances as without the option, and with the option off
  the corpus is the default one, byte for byte.
- The neural voice (``--extra-voices piper``, combinable with festival): ``piper_share`` (default
  0.25) of the seen speakers' utterances are taken from the seen espeak-ng ones that festival left,
  with a stream of their own (``default_rng((seed, split, i, 2))``), which also draws the voicing:
  length, noise and noise_w scales and the seed of the model's noise. As with festival, every
  other utterance and every other part of a plan stays the default plan's.
- Determinism: utterance i of a split draws everything from ``numpy.random.default_rng((seed,
  split, i))`` and the pool order; workers only run the synthesisers, so the output is identical
  for any number of jobs. Utterance ids are ``synth-{split}-{i:06d}``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np

from recipes.synth.sentences import normalise_text
from recipes.synth.voices import (
    ESPEAK_PITCH, ESPEAK_RATE_WPM, EXTRA_VOICES, FESTIVAL_DURATION_FACTOR, FESTIVAL_F0_FACTOR, FESTIVAL_SPEAKERS,
    FESTIVAL_VOICES, FLITE_DURATION_STRETCH, FLITE_F0_FACTOR, FLITE_VOICES, GAIN_DB, HELD_OUT_SPEAKER_IDS,
    PIPER_LENGTH_SCALE, PIPER_NOISE_SCALE, PIPER_NOISE_W_SCALE, PIPER_SPEAKERS, SPEAKERS, SPEAKERS_BY_ID,
)

CORPUS = "synth"
SPLITS = ("train", "dev", "test")
SPLIT_CODES = {"train": 0, "dev": 1, "test": 2}  # part of the per-utterance seed
POOL_FRACTIONS = {"train": 0.90, "dev": 0.05, "test": 0.05}
WORDS_PER_UTTERANCE = (14, 30)  # target drawn uniformly (inclusive), times the utterance scale
SENTENCES_PER_UTTERANCE = (2, 4)  # times the utterance scale
FLITE_SHARE = 0.25  # of the utterances spoken by seen speakers
FESTIVAL_SHARE = 0.25  # of the seen speakers' utterances, with --extra-voices festival (taken from espeak-ng's)
FESTIVAL_STREAM = 1  # the last entry of the seed of the festival draws: (seed, split, i, FESTIVAL_STREAM)
PIPER_SHARE = 0.25  # default share of the seen speakers' utterances, with --extra-voices piper
PIPER_STREAM = 2  # the last entry of the seed of the piper draws
HELD_OUT_SHARE_OF_TEST = 0.5
# Version of the planning rules: a folder made under other rules is not mixed with new utterances.
GENERATOR_VERSION = 1


# ----------------------------------------------------------------------------- sentences per split

def split_sentence_pools(sentences: list[str], seed: int) -> dict[str, list[str]]:
    """Disjoint train/dev/test sentence pools: the list shuffled by ``seed``, cut by POOL_FRACTIONS."""
    order = np.random.default_rng((seed, 99)).permutation(len(sentences))
    shuffled = [sentences[i] for i in order]
    n_dev = max(1, round(POOL_FRACTIONS["dev"] * len(shuffled)))
    n_test = max(1, round(POOL_FRACTIONS["test"] * len(shuffled)))
    return {"dev": shuffled[:n_dev], "test": shuffled[n_dev:n_dev + n_test], "train": shuffled[n_dev + n_test:]}


# ----------------------------------------------------------------------------- utterance plans

@dataclass(frozen=True)
class UtterancePlan:
    id: str
    split: str
    index: int
    sentences: tuple[str, ...]
    speaker: str
    prosody: dict = field(hash=False)
    gain_db: float = 0.0

    @property
    def text(self) -> str:
        """What the synthesiser reads: the sentences, each ending in a full stop."""
        return " ".join(self.sentences)


def parse_extra_voices(extra_voices: str | list[str] | tuple[str, ...] | None) -> tuple[str, ...]:
    """The extra voice sets asked for ("festival", or a comma-separated list; None or "" for none),
    sorted; an unknown one is a ValueError naming the choices."""
    if extra_voices is None:
        return ()
    names = extra_voices.split(",") if isinstance(extra_voices, str) else list(extra_voices)
    names = sorted({str(name).strip() for name in names} - {""})
    unknown = [name for name in names if name not in EXTRA_VOICES]
    if unknown:
        raise ValueError(f"unknown extra voices {', '.join(map(repr, unknown))} (--extra-voices, or "
                         f"synth_corpus.extra_voices in asr.train); the choices are: {', '.join(EXTRA_VOICES)}")
    return tuple(names)


def piper_share_of_espeak(piper_share: float | None, extra_voices: tuple[str, ...]) -> float:
    """The probability that a seen espeak-ng utterance (one festival did not take) becomes piper's,
    so that piper speaks ``piper_share`` of the seen speakers' utterances (0 without piper). A share
    given without piper, or beyond what espeak-ng has (0.75; 0.5 with festival), is a ValueError."""
    if "piper" not in extra_voices:
        if piper_share is not None:
            raise ValueError(f"piper_share={piper_share!r} needs the piper voice: add piper to the extra voices "
                             f"(--extra-voices piper; synth_corpus.extra_voices=piper in asr.train)")
        return 0.0
    share = PIPER_SHARE if piper_share is None else piper_share
    espeak_share = 1 - FLITE_SHARE - (FESTIVAL_SHARE if "festival" in extra_voices else 0)
    if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 < share <= espeak_share:
        raise ValueError(f"piper_share={share!r} (--piper-share; synth_corpus.piper_share in asr.train) must be a "
                         f"number above 0 and at most {espeak_share:g}, the seen espeak-ng utterances' share it "
                         f"is taken from{' beside festival' if 'festival' in extra_voices else ''}")
    return share / espeak_share


def speaker_ids(held_out: bool) -> list[str]:
    """The held-out speakers (test only), or the seen ones (all splits)."""
    if held_out:
        return list(HELD_OUT_SPEAKER_IDS)
    return [s.id for s in SPEAKERS if s.id not in HELD_OUT_SPEAKER_IDS]


class SplitPlanner:
    """The endless, deterministic sequence of utterance plans of one split."""

    def __init__(self, split: str, pool: list[str], seed: int, utterance_scale: int = 1,
                 extra_voices: tuple[str, ...] = (), piper_share: float | None = None):
        if not pool:
            raise ValueError(f"the sentence pool of split {split!r} is empty")
        self.split, self.pool, self.seed, self.extra_voices = split, pool, seed, extra_voices
        self.piper_probability = piper_share_of_espeak(piper_share, extra_voices)
        self.words_range = tuple(utterance_scale * n for n in WORDS_PER_UTTERANCE)
        self.sentences_range = tuple(utterance_scale * n for n in SENTENCES_PER_UTTERANCE)
        self._epoch, self._position, self._order = -1, len(pool), np.arange(0)
        self._next_index = 0

    def _next_sentence(self) -> str:
        if self._position >= len(self.pool):  # new round through the pool, in a new order
            self._epoch += 1
            self._order = np.random.default_rng((self.seed, SPLIT_CODES[self.split], 10**6 + self._epoch)) \
                .permutation(len(self.pool))
            self._position = 0
        sentence = self.pool[self._order[self._position]]
        self._position += 1
        return sentence

    def next_plan(self) -> UtterancePlan:
        index = self._next_index
        self._next_index += 1
        rng = np.random.default_rng((self.seed, SPLIT_CODES[self.split], index))

        held_out = self.split == "test" and rng.random() < HELD_OUT_SHARE_OF_TEST
        candidates = speaker_ids(held_out)
        if not held_out:  # choose the engine first, so flite's 4 voices are not swamped by espeak's 28
            engine = "flite" if rng.random() < FLITE_SHARE else "espeak-ng"
            candidates = [s for s in candidates if SPEAKERS_BY_ID[s].engine == engine]
        speaker = SPEAKERS_BY_ID[candidates[rng.integers(len(candidates))]]

        if speaker.engine == "espeak-ng":
            prosody = {"rate_wpm": int(rng.integers(ESPEAK_RATE_WPM[0], ESPEAK_RATE_WPM[1] + 1)),
                       "pitch": int(rng.integers(ESPEAK_PITCH[0], ESPEAK_PITCH[1] + 1))}
        else:
            prosody = {"duration_stretch": round(float(rng.uniform(*FLITE_DURATION_STRETCH)), 3),
                       "f0_mean_hz": round(FLITE_VOICES[speaker.voice] * float(rng.uniform(*FLITE_F0_FACTOR)), 1)}
        gain_db = round(float(rng.uniform(*GAIN_DB)), 2)

        target_words = int(rng.integers(self.words_range[0], self.words_range[1] + 1))
        sentences, words = [], 0
        while len(sentences) < self.sentences_range[0] or (
                words < target_words and len(sentences) < self.sentences_range[1]):
            sentence = self._next_sentence()
            sentences.append(sentence)
            words += len(normalise_text(sentence).split())
        plan = UtterancePlan(id=f"{CORPUS}-{self.split}-{index:06d}", split=self.split, index=index,
                             sentences=tuple(sentences), speaker=speaker.id, prosody=prosody, gain_db=gain_db)
        if "festival" in self.extra_voices and speaker.engine == "espeak-ng" and not held_out:
            plan = self._festival_instead(plan)
        if self.piper_probability and SPEAKERS_BY_ID[plan.speaker].engine == "espeak-ng" and not held_out:
            plan = self._piper_instead(plan)
        return plan

    def _festival_instead(self, plan: UtterancePlan) -> UtterancePlan:
        """The plan with a festival voice for FESTIVAL_SHARE of the seen speakers' utterances (a
        share of the espeak-ng ones), drawn from a stream of its own: the rest of the plan stays."""
        rng = np.random.default_rng((self.seed, SPLIT_CODES[self.split], plan.index, FESTIVAL_STREAM))
        if rng.random() >= FESTIVAL_SHARE / (1 - FLITE_SHARE):
            return plan
        speaker = FESTIVAL_SPEAKERS[rng.integers(len(FESTIVAL_SPEAKERS))]
        voice = FESTIVAL_VOICES[speaker.voice]
        duration_factor = float(rng.uniform(*FESTIVAL_DURATION_FACTOR))
        f0_factor = float(rng.uniform(*FESTIVAL_F0_FACTOR))  # drawn for every voice, used where it has an F0 model
        prosody = {"duration_stretch": round(voice.duration_stretch * duration_factor, 3)}
        if voice.f0_mean_hz is not None:
            prosody["f0_mean_hz"] = round(voice.f0_mean_hz * f0_factor, 1)
        return dataclasses.replace(plan, speaker=speaker.id, prosody=prosody)


    def _piper_instead(self, plan: UtterancePlan) -> UtterancePlan:
        """The plan with the piper voice for its share of the seen espeak-ng utterances, drawn from a
        stream of its own, with its voicing and the seed of its noise; the rest of the plan stays."""
        rng = np.random.default_rng((self.seed, SPLIT_CODES[self.split], plan.index, PIPER_STREAM))
        if rng.random() >= self.piper_probability:
            return plan
        speaker = PIPER_SPEAKERS[rng.integers(len(PIPER_SPEAKERS))]
        prosody = {"length_scale": round(float(rng.uniform(*PIPER_LENGTH_SCALE)), 3),
                   "noise_scale": round(float(rng.uniform(*PIPER_NOISE_SCALE)), 3),
                   "noise_w_scale": round(float(rng.uniform(*PIPER_NOISE_W_SCALE)), 3),
                   "noise_seed": int(rng.integers(2**31 - 1))}
        return dataclasses.replace(plan, speaker=speaker.id, prosody=prosody)


def plan_utterances(sentences: list[str], seed: int, counts: dict[str, int], utterance_scale: int = 1,
                    extra_voices: tuple[str, ...] = (),
                    piper_share: float | None = None) -> dict[str, list[UtterancePlan]]:
    """The first ``counts[split]`` plans of each split (no synthesis; drops are not known yet)."""
    pools = split_sentence_pools(sentences, seed)
    plans = {}
    for split in SPLITS:
        planner = SplitPlanner(split, pools[split], seed, utterance_scale, extra_voices, piper_share)
        plans[split] = [planner.next_plan() for _ in range(counts.get(split, 0))]
    return plans
