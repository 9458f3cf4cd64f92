"""The command line every recipe's prepare.py shares: its common options and how it runs
(`asr.data.corpus.manifest_builder` does the preparation itself; this is the recipe layer's part of it,
because a recipe's usage errors include the lexicon's)."""

from __future__ import annotations

from typing import Callable

from asr.data.corpus.manifest_builder import POLICIES, NoUtterancesError, PreparationError
from asr.data.corpus.preparation_report import format_report
from asr.core.exit_status import run_command
from recipes.lexicon import LexiconError


def add_preparation_arguments(parser, lexicon: str | None = None, lexicon_help: str = "") -> None:
    """Adds the options every recipe's command line shares: the lexicon options (when the
    corpus takes one: lexicon="optional" or "required"), the problem policies, --jobs and
    --no-progress."""
    if lexicon is not None:
        parser.add_argument("--lexicon", required=lexicon == "required",
                            help=lexicon_help or "CMUdict-format lexicon for phone targets")
        parser.add_argument("--extra-lexicon", nargs="*", default=[],
                            help="more CMUdict-format files, e.g. pronunciations for out-of-lexicon words")
        parser.add_argument("--oov", choices=POLICIES, default="error",
                            help="utterances with words missing from the lexicon: stop with a report, "
                                 "or leave them out")
    parser.add_argument("--bad-data", choices=POLICIES, default="error",
                        help="missing/unreadable audio or transcripts: stop with a report, or leave them out")
    parser.add_argument("--jobs", type=int, default=None, help="parallel audio conversions and checks")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def run_preparation(command: str, prepare: Callable[[], dict], layout_errors: tuple[type[Exception], ...] = (),
                    failures: tuple[type[Exception], ...] = (), after: Callable[[dict], None] | None = None,
                    resume_hint: str = "run the same command again: it continues from the audio converted so far"
                    ) -> int:
    """Runs a recipe's preparation for its command line (`command`, e.g. recipes.wsj.prepare) and
    returns its exit status (asr.core.exit_status): 0 after printing the report table (and whatever
    `after(report)` prints); USAGE_ERROR for a corpus folder or lexicon that is not what the recipe
    reads (layout_errors, LexiconError, a folder with no utterances) and
    FAILURE for a preparation that stopped on problems in the corpus (or on `failures`, e.g. a
    download that failed, or a program or package the machine lacks), each with its message and no
    traceback; INTERRUPTED after Ctrl-C, saying how to continue (resume_hint)."""
    def body():
        report = prepare()
        print(format_report(report))
        if after is not None:
            after(report)
    return run_command(command, body,
                       usage_errors=(LexiconError, NoUtterancesError, *layout_errors),
                       failures=(PreparationError, *failures), resume_hint=resume_hint)
