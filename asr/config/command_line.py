"""What every key=value command shares (asr.evaluate, asr.transcribe, asr.tune_lm, asr.average,
asr.benchmarks.decoding): main()'s opening and the arguments merged onto the command's dataclass.

    def main(argv=None) -> int:
        return run_key_value_command("asr.x", __doc__, body, argv, usage_errors=(XError,))
"""
from __future__ import annotations

import sys
from typing import Any, Callable, Iterable

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from asr.config.spelling import unknown_argument
from asr.core.exit_status import SUCCESS, run_command
from asr.core.warning_filters import install_warning_filters


def key_value_config(schema: type, dotlist: Iterable[str], error: type[Exception], noun: str = "arguments",
                     known: Iterable[str] | None = None, also: str = "") -> Any:
    """`key=value` arguments merged onto the dataclass `schema`, typed: an unknown key or a value of
    the wrong type raises `error` with OmegaConf's message and the keys there are (`known`, by
    default every field of the schema, then `also`)."""
    try:
        merged = OmegaConf.merge(OmegaConf.structured(schema), OmegaConf.from_dotlist(list(dotlist)))
    except OmegaConfBaseException as problem:
        known = list(schema.__dataclass_fields__ if known is None else known)
        raise error(unknown_argument(problem, known)   # a near miss: "did you mean checkpoint?"
                    or f"{getattr(problem, 'msg', problem)}; the {noun} are: {', '.join(known)}{also}") from None
    return schema(**OmegaConf.to_container(merged))


def run_key_value_command(command: str, doc: str, body: Callable[[list[str]], int | None], argv: list[str] | None,
                          usage_errors: tuple[type[BaseException], ...] = (),
                          failures: tuple[type[BaseException], ...] = (), resume_hint: str = "") -> int:
    """The main() of a key=value command: -h/--help prints the command's docstring `doc`;
    otherwise warnings are filtered (asr.core.warning_filters) and `body(argv)` runs under run_command.
    argv: the arguments (None: sys.argv[1:])."""
    argv = sys.argv[1:] if argv is None else argv
    if any(argument in ("-h", "--help") for argument in argv):
        print(doc)
        return SUCCESS
    install_warning_filters()
    return run_command(command, lambda: body(argv), usage_errors, failures, resume_hint)
