"""WSJ recipe on fixture trees: the LDC discs (index files, .wv1 SPHERE, .dot/.lsn transcripts) and a
Kaldi data directory (wav.scp with sph2pipe pipes, text, utt2spk)."""

import json
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile

from corpus_fixtures import flac_samples, read_gz_jsonl, tone, write_sphere_pcm, write_sphere_shorten
from asr.data.corpus.kaldi_dir import KaldiDataDirError
from asr.data.corpus.manifest_builder import PreparationError
from asr.data.audio.sphere import SphereError, read_sphere
from recipes.wsj.prepare import clean_wsj_tokens, main, prepare_wsj

LEXICON = """\
;;; a CMUdict-format fixture: comments, stress digits and alternative pronunciations
THE  DH AH0
THE(2)  DH IY0
SALE  S EY1 L
,COMMA  K AA1 M AH0
OF  AH1 V
HOTELS  HH OW0 T EH1 L Z
IS  IH1 Z
PART  P AA1 R T
U.S.  Y UW1 EH1 S
ONE  W AH1 N
TIME  T AY1 M
-DASH  D AE1 SH
STRATEGY  S T R AE1 T AH0 JH IY0
.PERIOD  P IH1 R IY0 AH0 D
PRICES  P R AY1 S AH0 Z
ROSE  R OW1 Z
SHARPLY  SH AA1 R P L IY0
TODAY  T AH0 D EY1
STOCKS  S T AA1 K S
FELL  F EH1 L
BONDS  B AA1 N D Z
"""

# utterance id -> (raw .dot transcript, expected text, expected phones, samples)
UTTERANCES = {
    "011c0201": ("[loud_breath] THE SALE ,COMMA OF THE HOTELS <IS> *PART* OF U.S. ONE-TIME --DASH STRATEGY "
                 ".PERIOD [door_slam>] ~",
                 "the sale comma of the hotels is part of u s one time dash strategy period",
                 "DH AH S EY L K AA M AH AH V DH AH HH OW T EH L Z IH Z P AA R T AH V Y UW EH S W AH N T AY M "
                 "D AE SH S T R AE T AH JH IY P IH R IY AH D", 9600),
    "011c0202": ("PRICES ROSE SHARPLY TODAY", "prices rose sharply today",
                 "P R AY S AH Z R OW Z SH AA R P L IY T AH D EY", 8000),
    "46gc0201": ("STOCKS \\FELL [/phone_ring] TODAY", "stocks fell today", "S T AA K S F EH L T AH D EY", 7200),
    "4k0c0301": ("BONDS ROSE", "bonds rose", "B AA N D Z R OW Z", 4800),
    "440c0401": ("STOCKS FELL [<door_slam]", "stocks fell", "S T AA K S F EH L", 5600),
}


def build_ldc_discs(root: Path) -> dict:
    """WSJ0 and WSJ1 disc folders as the LDC ships them; returns {utterance id: samples}."""
    samples = {u: tone(n, 300 + 40 * i, seed=i) for i, (u, (_, _, _, n)) in enumerate(UTTERANCES.items())}
    wsj0, wsj1 = root / "LDC93S6B", root / "LDC94S13B"
    for utterance in ("011c0201", "011c0202"):
        write_sphere_pcm(wsj0 / "11-1.1/wsj0/si_tr_s/011" / f"{utterance}.wv1", samples[utterance])
    write_sphere_pcm(wsj0 / "11-2.1/wsj0/si_tr_s/401/401c0201.wv1", tone(1600))  # excluded, as in Kaldi
    write_sphere_pcm(wsj0 / "11-14.1/wsj0/si_et_20/440/440c0401.wv1", samples["440c0401"])
    # Disc 13-16.1 was pressed with uppercase names.
    write_sphere_pcm(wsj1 / "13-16.1/WSJ1/SI_TR_S/46G/46GC0201.WV1", samples["46gc0201"])
    write_sphere_pcm(wsj1 / "13-16.1/WSJ1/SI_DT_20/4K0/4K0C0301.WV1", samples["4k0c0301"])

    def write(path: Path, text: str):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)

    header = ";; File: index\n;; Contains utterances\n;;\n"
    write(wsj0 / "11-13.1/wsj0/doc/indices/train/tr_s_wv1.ndx",
          header + "11_1_1:wsj0/si_tr_s/011/011c0201.wv1\n11_1_1:wsj0/si_tr_s/011/011c0202.wv1\n"
          "11_2_1:wsj0/si_tr_s/401/401c0201.wv1\n")
    write(wsj0 / "11-13.1/wsj0/doc/indices/test/nvp/si_et_20.ndx", header + "11_14_1:wsj0/si_et_20/440/440c0401\n")
    write(wsj1 / "13-34.1/wsj1/doc/indices/si_tr_s.ndx", header + "13_16_1:wsj1/si_tr_s/46g/46gc0201.wv1\n")
    write(wsj1 / "13-34.1/wsj1/doc/indices/h1_p0.ndx", header + "13_16_1: wsj1/si_dt_20/4k0/4k0c0301.wv1\n")
    dots = {"011c0201": UTTERANCES["011c0201"][0], "011c0202": UTTERANCES["011c0202"][0],
            "401c0201": "THE SALE"}
    write(wsj0 / "11-4.1/wsj0/transcrp/dots/si_tr_s/011/011c0200.dot",
          "".join(f"{dots[u]} ({u})\n" for u in ("011c0201", "011c0202")))
    write(wsj0 / "11-4.1/wsj0/transcrp/dots/si_tr_s/401/401c0200.dot", "THE SALE (401c0201)\n")
    write(wsj1 / "13-34.1/wsj1/trans/wsj1/si_tr_s/46g/46gc0200.dot", f"{UTTERANCES['46gc0201'][0]} (46gc0201)\n")
    write(wsj1 / "13-16.1/WSJ1/SI_DT_20/4K0/4K0C0300.DOT", f"{UTTERANCES['4k0c0301'][0]} (4k0c0301)\n")
    # eval92 has only a lexical-SNOR (.lsn) transcript here.
    write(wsj0 / "11-14.1/wsj0/si_et_20/440/440c0400.lsn", f"{UTTERANCES['440c0401'][0]} (440c0401)\n")
    return samples


def check_manifests(out: Path, samples: dict, splits: dict):
    for split, ids in splits.items():
        cuts = read_gz_jsonl(out / f"wsj_cuts_{split}.jsonl.gz")
        assert [c["id"] for c in cuts] == ids
        for cut in cuts:
            _, text, phones, count = UTTERANCES[cut["id"]]
            supervision = cut["supervisions"][0]
            assert supervision["text"] == text
            assert supervision["custom"]["phones"] == phones
            assert supervision["speaker"] == cut["id"][:3]
            assert cut["duration"] == pytest.approx(count / 16000, abs=1e-9)
            np.testing.assert_array_equal(flac_samples(cut["recording"]["sources"][0]["source"], out), samples[cut["id"]])
        supervisions = read_gz_jsonl(out / f"wsj_supervisions_{split}.jsonl.gz")
        assert [s["id"] for s in supervisions] == ids


SPLITS = {"train": ["011c0201", "011c0202", "46gc0201"], "dev": ["4k0c0301"], "test": ["440c0401"]}


def test_clean_wsj_tokens_follows_kaldi_normalisation():
    raw = "[loud_breath] <THE> *SALE* \\.PERIOD --DASH [<door] [door>] [/ring] [ring/] ~ . <NOISE> %PERCENT"
    assert clean_wsj_tokens(raw.split()) == ["THE", "SALE", ".PERIOD", "-DASH", "%PERCENT"]


def test_ldc_discs(tmp_path, capsys):
    samples = build_ldc_discs(tmp_path / "corpus")
    (tmp_path / "cmudict").write_text(LEXICON)
    out = tmp_path / "out"
    code = main(["--corpus-dir", str(tmp_path / "corpus" / "LDC93S6B"), str(tmp_path / "corpus" / "LDC94S13B"),
                 "--lexicon", str(tmp_path / "cmudict"), "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    check_manifests(out, samples, SPLITS)
    report = json.loads((out / "wsj_report.json").read_text())
    assert report["splits"]["train"] == {"utterances": 3, "speakers": 2, "words": 16 + 4 + 3,
                                         "hours": round((9600 + 8000 + 7200) / 16000 / 3600, 4)}
    assert "train" in capsys.readouterr().out


def test_si84_uses_wsj0_only(tmp_path):
    build_ldc_discs(tmp_path / "corpus")
    (tmp_path / "cmudict").write_text(LEXICON)
    report = prepare_wsj(tmp_path / "corpus", tmp_path / "out", tmp_path / "cmudict", train_set="si84", progress=False)
    assert [c["id"] for c in read_gz_jsonl(tmp_path / "out" / "wsj_cuts_train.jsonl.gz")] == ["011c0201", "011c0202"]
    assert report["splits"]["test"]["utterances"] == 1


def build_kaldi_dir(root: Path, samples: dict, corpus: Path) -> None:
    """A Kaldi data/ folder pointing at the fixture discs, as wsj_data_prep.sh writes it."""
    wv1 = {u: next(corpus.rglob(f"{u}.wv1"), None) or next(corpus.rglob(f"{u.upper()}.WV1")) for u in UTTERANCES}
    plain_wav = root / "4k0c0301.wav"
    root.mkdir(parents=True, exist_ok=True)
    soundfile.write(plain_wav, samples["4k0c0301"], 16000, subtype="PCM_16")
    kaldi_text = {  # Kaldi's normalize_transcript.pl output: noise as <NOISE>, markup resolved
        "011c0201": "<NOISE> THE SALE ,COMMA OF THE HOTELS IS *PART* OF U.S. ONE-TIME -DASH STRATEGY .PERIOD",
        "011c0202": "PRICES ROSE SHARPLY TODAY", "46gc0201": "STOCKS FELL <NOISE> TODAY",
        "4k0c0301": "BONDS ROSE", "440c0401": "STOCKS FELL",
    }
    wav_scp = {
        "011c0201": f"/usr/bin/sph2pipe -f wav {wv1['011c0201']} |",  # Kaldi writes sph2pipe's full path
        "011c0202": f"sph2pipe -f wav -p {wv1['011c0202']} |",
        "46gc0201": f"sph_decoder_not_installed {wv1['46gc0201']} |",
        "4k0c0301": str(plain_wav),
        "440c0401": f"sph2pipe -f wav {wv1['440c0401']} |",
    }
    for split, name in (("train", "train_si284"), ("dev", "test_dev93"), ("test", "test_eval92")):
        folder = root / name
        folder.mkdir()
        ids = SPLITS[split]
        (folder / "wav.scp").write_text("".join(f"{u} {wav_scp[u]}\n" for u in ids))
        (folder / "text").write_text("".join(f"{u} {kaldi_text[u]}\n" for u in ids))
        (folder / "utt2spk").write_text("".join(f"{u} {u[:3]}\n" for u in ids))


def test_kaldi_data_dir(tmp_path, monkeypatch):
    samples = build_ldc_discs(tmp_path / "corpus")
    build_kaldi_dir(tmp_path / "kaldi" / "data", samples, tmp_path / "corpus")
    (tmp_path / "cmudict").write_text(LEXICON)
    from asr.data.audio import audio_source

    # sph2pipe is not installed here: its commands are read natively. Another program that is not
    # installed gets a message naming it.
    real_which = shutil.which
    monkeypatch.setattr(audio_source.shutil, "which", lambda p: None if "sph2pipe" in p else real_which(p))
    # wav.scp's `|` lines are shell commands: nothing runs without --allow-commands
    with pytest.raises(KaldiDataDirError, match=r"train_si284/wav.scp: line 1 \(011c0201\) gets its audio by running "
                                                r"the shell command `/usr/bin/sph2pipe .*only with --allow-commands"):
        prepare_wsj(tmp_path / "kaldi" / "data", tmp_path / "out", tmp_path / "cmudict", progress=False)
    assert not (tmp_path / "out" / "audio").exists()
    with pytest.raises(PreparationError, match=r"46gc0201: wav.scp command .*needs `sph_decoder_not_installed`, which is not installed"):
        prepare_wsj(tmp_path / "kaldi" / "data", tmp_path / "out", tmp_path / "cmudict", progress=False,
                    allow_commands=True)

    # Any installed command is run as written; its output may be any format libsndfile reads (here the
    # SPHERE stream itself).
    wav_scp = tmp_path / "kaldi" / "data" / "train_si284" / "wav.scp"
    wav_scp.write_text(wav_scp.read_text().replace("sph_decoder_not_installed", "cat"))
    prepare_wsj(tmp_path / "kaldi" / "data", tmp_path / "out", tmp_path / "cmudict", progress=False,
                allow_commands=True)
    check_manifests(tmp_path / "out", samples, SPLITS)


def test_out_of_lexicon_words_report_then_extra_lexicon_resumes(tmp_path, monkeypatch):
    samples = build_ldc_discs(tmp_path / "corpus")
    lexicon = tmp_path / "cmudict"
    lexicon.write_text("\n".join(l for l in LEXICON.splitlines() if not l.startswith(("ROSE", "SHARPLY"))) + "\n")
    out = tmp_path / "out"
    with pytest.raises(PreparationError) as caught:
        prepare_wsj(tmp_path / "corpus", out, lexicon, progress=False)
    message = str(caught.value)
    assert "2 oov" in message and "011c0202: not in the lexicon: ROSE SHARPLY" in message
    assert "4k0c0301: not in the lexicon: ROSE" in message
    assert "--extra-lexicon" in message and "--oov drop" in message
    report = json.loads((out / "wsj_report.json").read_text())
    assert report["status"] == "failed" and report["oov_words"] == {"ROSE": 2, "SHARPLY": 1}
    assert not list(out.glob("*.jsonl.gz"))
    assert len(list((out / "audio").glob("*.flac"))) == 5  # all audio converted: the re-run reuses it

    dropped = prepare_wsj(tmp_path / "corpus", tmp_path / "out_drop", lexicon, oov_policy="drop", progress=False)
    assert dropped["splits"]["train"]["utterances"] == 2 and "dev" not in dropped["splits"]
    assert dropped["problem_counts"] == {"oov": 2}

    extra = tmp_path / "my_words.txt"
    extra.write_text("ROSE  R OW1 Z\nsharply sh aa1 r p l iy0 # lowercase cmudict.dict style\n")
    from asr.data.audio.audio_source import AudioSource
    loaded = []
    monkeypatch.setattr(AudioSource, "load", lambda self: loaded.append(self) or (_ for _ in ()).throw(AssertionError))
    prepare_wsj(tmp_path / "corpus", out, lexicon, extra_lexicon=[extra], progress=False)
    assert loaded == []  # nothing decoded again
    check_manifests(out, samples, SPLITS)


def test_lexicon_with_foreign_phones_is_rejected(tmp_path, capsys):
    build_ldc_discs(tmp_path / "corpus")
    (tmp_path / "lex").write_text("THE  DH AX\n")
    assert main(["--corpus-dir", str(tmp_path / "corpus"), "--lexicon", str(tmp_path / "lex"),
                 "--out", str(tmp_path / "out")]) == 2
    assert "lex:1: phone(s) ['AX'] of 'THE' are not CMUdict's 39 phones" in capsys.readouterr().err
    assert main(["--corpus-dir", str(tmp_path / "corpus"), "--lexicon", str(tmp_path / "nope"),
                 "--out", str(tmp_path / "out")]) == 2
    assert "nope not found" in capsys.readouterr().err


def test_missing_index_names_the_discs_to_pass(tmp_path, capsys):
    build_ldc_discs(tmp_path / "corpus")
    (tmp_path / "cmudict").write_text(LEXICON)
    assert main(["--corpus-dir", str(tmp_path / "corpus" / "LDC93S6B"), "--lexicon", str(tmp_path / "cmudict"),
                 "--out", str(tmp_path / "out")]) == 2
    assert "wsj1/doc/indices/si_tr_s.ndx not found" in capsys.readouterr().err


def test_missing_wv1_is_reported_and_can_be_dropped(tmp_path):
    build_ldc_discs(tmp_path / "corpus")
    (tmp_path / "cmudict").write_text(LEXICON)
    next((tmp_path / "corpus").rglob("011c0202.wv1")).unlink()
    with pytest.raises(PreparationError, match=r"(?s)1 missing_audio.*011c0202\.wv1: file not found"):
        prepare_wsj(tmp_path / "corpus", tmp_path / "out", tmp_path / "cmudict", progress=False)
    report = prepare_wsj(tmp_path / "corpus", tmp_path / "out", tmp_path / "cmudict", bad_data_policy="drop",
                         progress=False)
    assert report["splits"]["train"]["utterances"] == 2 and report["problem_counts"] == {"missing_audio": 1}


@pytest.mark.skipif(shutil.which("ffmpeg") is None and shutil.which("sph2pipe") is None,
                    reason="needs ffmpeg or sph2pipe (bash .ci/install.sh installs ffmpeg)")
def test_shorten_compressed_wv1_is_decoded(tmp_path):
    audio = np.stack([tone(3000, 500), tone(3000, 700, seed=3)])
    write_sphere_shorten(tmp_path / "mono.wv1", audio[0])
    write_sphere_shorten(tmp_path / "stereo.wv1", audio)
    decoded, rate = read_sphere(tmp_path / "mono.wv1")
    assert rate == 16000
    np.testing.assert_array_equal(decoded, audio[:1])
    np.testing.assert_array_equal(read_sphere(tmp_path / "stereo.wv1")[0], audio)


def test_shorten_without_a_decoder_says_what_to_install(tmp_path, monkeypatch):
    from asr.data.audio import sphere

    write_sphere_shorten(tmp_path / "x.wv1", tone(1000))
    monkeypatch.setattr(sphere.shutil, "which", lambda name: None)
    with pytest.raises(SphereError, match=r"x\.wv1: this SPHERE file is shorten-compressed .*apt-get install ffmpeg.*sph2pipe"):
        read_sphere(tmp_path / "x.wv1")


def test_sph2pipe_is_used_when_installed(tmp_path, monkeypatch):
    """With sph2pipe on PATH, compressed SPHERE goes through `sph2pipe -f wav -p FILE`."""
    expected = np.stack([tone(800, 250), tone(800, 650, seed=5)])
    np.save(tmp_path / "decoded.npy", expected)
    write_sphere_shorten(tmp_path / "x.wv1", expected)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "sph2pipe"  # stands in for LDC's decoder: logs its arguments, writes a WAV
    fake.write_text(f"""#!{sys.executable}
import io, sys, numpy, soundfile
open({str(tmp_path / 'args.txt')!r}, 'w').write(' '.join(sys.argv[1:]))
buffer = io.BytesIO()
soundfile.write(buffer, numpy.load({str(tmp_path / 'decoded.npy')!r}).T, 16000, format='WAV', subtype='PCM_16')
sys.stdout.buffer.write(buffer.getvalue())
""")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    decoded, rate = read_sphere(tmp_path / "x.wv1")
    assert (tmp_path / "args.txt").read_text() == f"-f wav -p {tmp_path / 'x.wv1'}"
    np.testing.assert_array_equal(decoded, expected)
