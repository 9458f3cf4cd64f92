"""Layers only point down: attention_ext (bottom) <- asr <- recipes (top), and inside asr the
commands (modules run as `python -m asr.X`) sit above the library: no module of asr imports one.
Inside asr the library's packages are layers too (ASR_LAYERS, README's layout): core and text at
the bottom, then data, model, config and evaluation, training, and the commands on top; a package
imports its own modules and the layers below it, never a peer or a layer above. asr's measurement
tools (asr/benchmarks/) sit on top beside the commands: they may import any layer, no module outside
them imports one, and asr's top level holds only commands and layer folders.

A module may import its own package and the packages below it, never one above it (README,
"Layout"). The check reads every module's import statements, also those inside functions, and
importlib.import_module / __import__ calls with a literal name. asr reaches a recipe only through
the corpus-recipe entry point (asr/data/corpus/corpus_recipes.py), which this check cannot see and
need not: they name no package in asr's code.
"""
from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LAYERS = ("attention_ext", "asr", "recipes")  # bottom first


def imported_names(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, dotted name) of every absolute import in a module."""
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append((node.lineno, node.module))
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str):
            function = node.func
            called = function.attr if isinstance(function, ast.Attribute) else getattr(function, "id", "")
            if called in ("import_module", "__import__"):
                names.append((node.lineno, node.args[0].value))
    return names


def upward_imports(root: Path) -> list[str]:
    """'path:line: asr imports recipes.x' for every import of a layer above the module's own."""
    found = []
    for rank, package in enumerate(LAYERS):
        for path in sorted((root / package).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
            for line, name in imported_names(tree):
                top = name.split(".")[0]
                if top in LAYERS and LAYERS.index(top) > rank:
                    found.append(f"{path.relative_to(root)}:{line}: {package} imports {name} "
                                 f"(a layer above it)")
    return found


def test_every_layer_imports_only_itself_and_the_layers_below():
    for package in LAYERS:
        assert (REPO / package / "__init__.py").is_file(), package
    assert upward_imports(REPO) == []


def test_the_check_finds_a_planted_upward_import(tmp_path):
    for package in LAYERS:
        (tmp_path / package / "sub").mkdir(parents=True)
        (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / "recipes" / "ok.py").write_text("import asr.data\nfrom attention_ext import build_attention\n")
    (tmp_path / "asr" / "ok.py").write_text("from attention_ext.registry import registered\nfrom . import x\n")
    (tmp_path / "asr" / "sub" / "bad.py").write_text(
        "import os\n\ndef late():\n    from recipes.synth.prepare import prepare_synth\n")
    (tmp_path / "attention_ext" / "bad.py").write_text(
        "import importlib\nimport asr\nmodule = importlib.import_module('recipes.lexicon')\n")
    assert upward_imports(tmp_path) == [
        "attention_ext/bad.py:2: attention_ext imports asr (a layer above it)",
        "attention_ext/bad.py:3: attention_ext imports recipes.lexicon (a layer above it)",
        "asr/sub/bad.py:4: asr imports recipes.synth.prepare (a layer above it)",
    ]


# ---- inside asr: commands above the library ---------------------------------------------------------
def command_modules(root: Path) -> dict[str, Path]:
    """Dotted name -> path of every asr module that runs as a command (`if __name__ == "__main__":`)."""
    commands = {}
    for path in sorted((root / "asr").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        if any(isinstance(node, ast.If) and "__name__" in ast.unparse(node.test) and "__main__" in ast.unparse(node.test)
               for node in tree.body):
            commands[".".join(path.relative_to(root).with_suffix("").parts)] = path
    return commands


def imports_of_commands(root: Path) -> list[str]:
    """'path:line: asr.x imports the command asr.y' for every import of a command module inside asr."""
    commands = command_modules(root)
    found = []
    for path in sorted((root / "asr").rglob("*.py")):
        module = ".".join(path.relative_to(root).with_suffix("").parts)
        for line, name in imported_names(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            if name in commands and name != module:
                found.append(f"{path.relative_to(root)}:{line}: {module} imports the command {name}")
    return found


def test_no_module_of_asr_imports_a_command():
    commands = command_modules(REPO)
    assert {"asr.train", "asr.evaluate", "asr.transcribe", "asr.benchmarks.data"} <= set(commands)
    assert not any(name.startswith(("asr.data.", "asr.model.", "asr.evaluation.decoding.")) for name in commands), \
        "a command inside a library folder"
    assert imports_of_commands(REPO) == []


def test_the_check_finds_a_planted_import_of_a_command(tmp_path):
    (tmp_path / "asr" / "data").mkdir(parents=True)
    (tmp_path / "asr" / "__init__.py").write_text("")
    (tmp_path / "asr" / "run.py").write_text("import sys\n\nif __name__ == '__main__':\n    sys.exit(0)\n")
    (tmp_path / "asr" / "library.py").write_text("import os\n")
    (tmp_path / "asr" / "other.py").write_text("from asr.library import x\n\nif __name__ == \"__main__\":\n    pass\n")
    (tmp_path / "asr" / "data" / "bad.py").write_text("def late():\n    from asr.run import main\n")
    (tmp_path / "asr" / "worse.py").write_text("import asr.other\n")
    assert set(command_modules(tmp_path)) == {"asr.run", "asr.other"}
    assert imports_of_commands(tmp_path) == [
        "asr/data/bad.py:2: asr.data.bad imports the command asr.run",
        "asr/worse.py:1: asr.worse imports the command asr.other",
    ]


# ---- inside asr: the library's packages as layers ----------------------------------------------------
ASR_LAYERS = (("asr.core", "asr.text"), ("asr.data",), ("asr.model",), ("asr.config", "asr.evaluation"),
              ("asr.training",))   # bottom first; every other module of asr is a command, on top


def asr_room(dotted: str) -> str:
    """The layer member a dotted asr name belongs to: its package of ASR_LAYERS, or itself (a command)."""
    for layer in ASR_LAYERS:
        for package in layer:
            if dotted == package or dotted.startswith(package + "."):
                return package
    parts = dotted.split(".")
    return ".".join(parts[:2])   # asr.train, asr.benchmarks


def asr_rank(room: str) -> int:
    return next((rank for rank, layer in enumerate(ASR_LAYERS) if room in layer), len(ASR_LAYERS))


def asr_room_imports(root: Path) -> dict[str, set[str]]:
    """Room -> the other rooms of asr it imports."""
    rooms: dict[str, set[str]] = {}
    for path in sorted((root / "asr").rglob("*.py")):
        module = ".".join(path.relative_to(root).with_suffix("").parts)
        if module == "asr.__init__":
            continue
        room = asr_room(module)
        found = rooms.setdefault(room, set())
        for _, name in imported_names(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            if name.startswith("asr.") and asr_room(name) != room:
                found.add(asr_room(name))
    return rooms


def imports_against_the_asr_layers(root: Path) -> list[str]:
    return sorted(f"{room} imports {other}" for room, others in asr_room_imports(root).items() for other in others
                  if asr_rank(other) >= asr_rank(room))


def import_levels(rooms: dict[str, set[str]]) -> int:
    """The longest chain of imports between rooms, counted in rooms (a room importing nothing: 1)."""
    levels: dict[str, int] = {}

    def level(room: str) -> int:
        if room not in levels:
            levels[room] = 1 + max((level(other) for other in rooms.get(room, ())), default=0)
        return levels[room]
    return max(level(room) for room in rooms)


def test_asr_packages_import_only_the_layers_below_them_and_six_levels_at_most():
    assert imports_against_the_asr_layers(REPO) == []
    assert import_levels(asr_room_imports(REPO)) <= 6


def test_the_asr_layer_check_finds_a_peer_import_and_an_upward_one(tmp_path):
    for package in ("core", "data", "config", "evaluation"):
        (tmp_path / "asr" / package).mkdir(parents=True)
    (tmp_path / "asr" / "__init__.py").write_text("")
    (tmp_path / "asr" / "core" / "errors.py").write_text("import os\n")
    (tmp_path / "asr" / "data" / "ok.py").write_text("from asr.core.errors import ConfigError\n")
    (tmp_path / "asr" / "data" / "bad.py").write_text("from asr.config.schema import validate_config\n")
    (tmp_path / "asr" / "config" / "peer.py").write_text("import asr.evaluation.evaluation\n")
    (tmp_path / "asr" / "train.py").write_text("from asr.config.schema import validate_config\n")
    assert imports_against_the_asr_layers(tmp_path) == ["asr.config imports asr.evaluation",
                                                        "asr.data imports asr.config"]
    assert import_levels({"a": {"b"}, "b": {"c"}, "c": set()}) == 3


# ---- asr's top level: user commands, layer folders and benchmarks/ (which the section below guards) ----
ASR_BENCHMARKS = "asr.benchmarks"   # asr's measurement tools; every other top-level module is a user command


def asr_top_level_strays(root: Path) -> list[str]:
    """What asr's top level holds besides user commands (`asr/<command>.py`) and layer folders: a module
    that is no command, a measurement tool outside benchmarks/, a package that is no layer."""
    layers = {package for layer in ASR_LAYERS for package in layer} | {ASR_BENCHMARKS}
    commands = command_modules(root)
    found = []
    for entry in sorted((root / "asr").iterdir()):
        if entry.suffix == ".py" and entry.name != "__init__.py":
            if f"asr.{entry.stem}" not in commands:
                found.append(f"asr/{entry.name}: not a command")
            elif "benchmark" in entry.stem:
                found.append(f"asr/{entry.name}: a measurement tool outside asr/benchmarks/")
        elif (entry / "__init__.py").is_file() and f"asr.{entry.name}" not in layers:
            found.append(f"asr/{entry.name}/: a package that is neither a layer of asr nor its benchmarks")
    return found


def test_asr_benchmarks_sit_on_top_and_asr_top_level_holds_only_commands():
    commands = command_modules(REPO)
    assert {"asr.benchmarks.data", "asr.benchmarks.scale", "asr.benchmarks.decoding", "asr.benchmarks.longform",
            "asr.benchmarks.step.__main__"} <= set(commands)
    assert asr_rank(asr_room("asr.benchmarks.step.workloads")) == len(ASR_LAYERS)   # above every layer
    assert asr_top_level_strays(REPO) == []


def test_the_top_level_check_finds_a_stray_module_package_and_tool(tmp_path):
    for folder in ("attention_ext", "recipes/synth", "asr/data", "asr/benchmarks/step", "asr/helpers"):
        (tmp_path / folder).mkdir(parents=True)
    for package in ("attention_ext", "recipes", "asr", "asr/data", "asr/benchmarks", "asr/benchmarks/step",
                    "asr/helpers"):
        (tmp_path / package / "__init__.py").write_text("")
    command = "import sys\n\nif __name__ == '__main__':\n    sys.exit(0)\n"
    (tmp_path / "asr" / "benchmarks" / "step" / "timing.py").write_text("from asr.data.features.features import FilterBank\n")
    (tmp_path / "asr" / "benchmarks" / "scale.py").write_text("from .step import timing\n" + command)
    (tmp_path / "asr" / "train.py").write_text("from asr.data.features.features import FilterBank\n" + command)
    (tmp_path / "asr" / "worse.py").write_text("from asr import benchmarks\n" + command)
    (tmp_path / "asr" / "speed_benchmark.py").write_text(command)
    (tmp_path / "asr" / "shared.py").write_text("import os\n")
    assert asr_top_level_strays(tmp_path) == [
        "asr/helpers/: a package that is neither a layer of asr nor its benchmarks",
        "asr/shared.py: not a command",
        "asr/speed_benchmark.py: a measurement tool outside asr/benchmarks/",
    ]
# ---- benchmarks folders: tools that nothing else imports ----------------------------------------------
# attention_ext/benchmarks/ (the library's tools) and asr/benchmarks/ (asr's measurement tools) hold
# commands that measure; no module outside a benchmarks folder imports one, and `import attention_ext`
# runs none of them. attention_ext is the library alone: no file of it names the layers above (their
# packages, their commands, their presets), and its registry, contract and kernel loader import no
# attention (the attentions import them).
BENCHMARKS = ("attention_ext.benchmarks", "asr.benchmarks")
ATTENTION_EXT_BASE = ("registry.py", "contract.py", "dispatch.py", "_ops.py", "_fake_kernels.py")


def dotted(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_submodule(root: Path, package: str, name: str) -> bool:
    folder = root.joinpath(*package.split("."))
    return (folder / name).is_dir() or any(folder.glob(f"{name}.*"))   # name.py, or a compiled name.<abi>.so


def resolved_imports(path: Path, root: Path) -> list[tuple[int, str]]:
    """(line, dotted name) of every import of a module, relative ones resolved (`from .x import y` in
    attention_ext/a.py: attention_ext.x; `from . import x`: attention_ext.x where x is a module)."""
    package = dotted(path, root) if path.name == "__init__.py" else dotted(path, root).rpartition(".")[0]
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    from_lines = {(node.lineno, node.module) for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    names = [(line, name) for line, name in imported_names(tree) if (line, name) not in from_lines]
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([node.module] if node.module else []))
            subs = [f"{base}.{alias.name}" for alias in node.names if is_submodule(root, base, alias.name)]
            names += [(node.lineno, name) for name in subs or [base]]
    return sorted(set(names))


def in_benchmarks(name: str) -> bool:
    return any(name == folder or name.startswith(folder + ".") for folder in BENCHMARKS)


def imports_of_benchmarks(root: Path) -> list[str]:
    """'path:line: module imports benchmarks.x' for every import of a benchmarks folder from outside one."""
    found = []
    for package in LAYERS:
        for path in sorted((root / package).rglob("*.py")):
            module = dotted(path, root)
            if in_benchmarks(module):
                continue
            found += [f"{path.relative_to(root)}:{line}: {module} imports {name}"
                      for line, name in resolved_imports(path, root) if in_benchmarks(name)]
    return found


def test_no_module_outside_a_benchmarks_folder_imports_one():
    for folder in BENCHMARKS:
        assert (REPO.joinpath(*folder.split(".")) / "__init__.py").is_file(), folder
    assert imports_of_benchmarks(REPO) == []


def test_the_check_finds_a_planted_import_of_a_benchmark(tmp_path):
    for folder in ("attention_ext/benchmarks/speed", "asr/benchmarks", "asr/evaluation", "recipes"):
        (tmp_path / folder).mkdir(parents=True, exist_ok=True)
    for package in ("attention_ext", "attention_ext/benchmarks", "attention_ext/benchmarks/speed", "asr",
                    "asr/benchmarks", "recipes"):
        (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / "attention_ext" / "registry.py").write_text("import torch\n")
    (tmp_path / "attention_ext" / "benchmarks" / "speed" / "cases.py").write_text("from ...registry import x\n")
    (tmp_path / "attention_ext" / "benchmarks" / "speed" / "__main__.py").write_text("from .cases import x\n")
    (tmp_path / "asr" / "benchmarks" / "step.py").write_text("from attention_ext.benchmarks.speed import cases\n")
    (tmp_path / "attention_ext" / "comparisons.py").write_text("from . import benchmarks\n")
    (tmp_path / "asr" / "evaluation" / "bad.py").write_text("def late():\n    import asr.benchmarks.step\n")
    (tmp_path / "recipes" / "bad.py").write_text("from asr.benchmarks import step\n")
    assert imports_of_benchmarks(tmp_path) == [
        "attention_ext/comparisons.py:1: attention_ext.comparisons imports attention_ext.benchmarks",
        "asr/evaluation/bad.py:2: asr.evaluation.bad imports asr.benchmarks.step",
        "recipes/bad.py:1: recipes.bad imports asr.benchmarks.step",
    ]


def preset_names(root: Path) -> set[str]:
    """Every `conf=` preset: the setups of conf/conf and each corpus setup with each attention."""
    setups = {path.stem for path in (root / "conf" / "conf").glob("*.yaml")}
    attentions = {path.stem for path in (root / "conf" / "attention").glob("*.yaml")}
    return setups | {f"{setup}_{attention}" for setup in setups for attention in attentions}


UPPER_MODULE = re.compile(r"^(asr|recipes)(\.\w+)+$|(^|\s)-m\s+(asr|recipes)\b|^conf=")


def names_of_upper_layers(root: Path) -> list[str]:
    """'path:line: what' for every import of asr or recipes in attention_ext, every string that names
    one of their modules (`"asr.train"`, `"-m asr.train"`, `"-m", "asr..."`), and every preset name."""
    presets, found = preset_names(root), []
    for path in sorted((root / "attention_ext").rglob("*")):
        where = path.relative_to(root)
        if path.suffix == ".sh":
            found += [f"{where}:{number}: {line.strip()}" for number, line in
                      enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if re.search(r"-m\s+(asr|recipes)\b", line)]
        if path.suffix != ".py":
            continue
        found += [f"{where}:{line}: imports {name}" for line, name in resolved_imports(path, root)
                  if name.split(".")[0] in ("asr", "recipes")]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                if UPPER_MODULE.search(node.value.strip()) or node.value in presets:
                    found.append(f"{where}:{node.lineno}: names {node.value.strip()!r}")
    return sorted(found)


def test_attention_ext_names_neither_asr_nor_recipes():
    assert "synth_iclustered" in preset_names(REPO)
    assert names_of_upper_layers(REPO) == []


def test_the_check_finds_planted_names_of_the_layers_above(tmp_path):
    (tmp_path / "attention_ext" / "tools").mkdir(parents=True)
    (tmp_path / "conf" / "conf").mkdir(parents=True)
    (tmp_path / "conf" / "attention").mkdir(parents=True)
    (tmp_path / "conf" / "conf" / "synth.yaml").write_text("")
    (tmp_path / "conf" / "attention" / "full.yaml").write_text("")
    (tmp_path / "attention_ext" / "__init__.py").write_text('"""Knows nothing about speech (asr is above)."""\n')
    (tmp_path / "attention_ext" / "tools" / "run.py").write_text(
        'import sys\ncommand = [sys.executable, "-m", "asr.train", "conf=demo"]\n'
        'other = "python -m recipes.synth.prepare"\npreset = "synth_full"\nshape = "asr"\n')
    (tmp_path / "attention_ext" / "tools" / "late.py").write_text("def f():\n    from asr.core import exit_status\n")
    (tmp_path / "attention_ext" / "tools" / "carry.sh").write_text("#!/bin/sh\npython3 -m asr.train\n")
    assert names_of_upper_layers(tmp_path) == [
        "attention_ext/tools/carry.sh:2: python3 -m asr.train",
        "attention_ext/tools/late.py:2: imports asr.core",
        "attention_ext/tools/run.py:2: names 'asr.train'",
        "attention_ext/tools/run.py:2: names 'conf=demo'",
        "attention_ext/tools/run.py:3: names 'python -m recipes.synth.prepare'",
        "attention_ext/tools/run.py:4: names 'synth_full'",
    ]


def attention_imports_of_the_base(root: Path) -> list[str]:
    """'path:line: imports name' where registry, contract, dispatch or the kernel loader imports an
    attention, or the package's face (which imports every attention)."""
    found = []
    for name in ATTENTION_EXT_BASE:
        path = root / "attention_ext" / name
        found += [f"{path.relative_to(root)}:{line}: imports {imported}" for line, imported in resolved_imports(path, root)
                  if imported == "attention_ext" or imported.startswith("attention_ext.attentions")]
    return found


def test_registry_contract_and_the_kernel_loader_import_no_attention():
    assert attention_imports_of_the_base(REPO) == []


def test_the_check_finds_a_planted_attention_import_in_the_base(tmp_path):
    (tmp_path / "attention_ext" / "attentions").mkdir(parents=True)
    (tmp_path / "attention_ext" / "attentions" / "full.py").write_text("")
    (tmp_path / "attention_ext" / "_C.cpython-311-x86_64-linux-gnu.so").write_text("")
    (tmp_path / "attention_ext" / "_fake_kernels.py").write_text("")
    for name in ATTENTION_EXT_BASE:
        (tmp_path / "attention_ext" / name).write_text("import torch\n")
    (tmp_path / "attention_ext" / "_ops.py").write_text("from . import _C\nfrom . import _fake_kernels\n")
    (tmp_path / "attention_ext" / "registry.py").write_text("def late():\n    from .attentions.full import x\n")
    (tmp_path / "attention_ext" / "contract.py").write_text("from attention_ext import build_attention\n")
    assert attention_imports_of_the_base(tmp_path) == [
        "attention_ext/registry.py:2: imports attention_ext.attentions.full",
        "attention_ext/contract.py:1: imports attention_ext",
    ]


def test_importing_attention_ext_runs_no_tool_and_needs_no_plotting():
    """In a fresh interpreter, with matplotlib and tqdm made unimportable: `import attention_ext`
    works, builds an attention, and loads no module of its benchmarks folder."""
    script = ("import sys\n"
              "sys.modules['matplotlib'] = sys.modules['tqdm'] = None   # an import of either now fails\n"
              "import torch, attention_ext\n"
              "attention_ext.build_attention('clustered', clusters=2)(*[torch.randn(1, 1, 4, 8)] * 3)\n"
              "print(sorted(name for name in sys.modules if name.startswith('attention_ext.benchmarks')))\n"
              "print(sorted(name for name in sys.modules if name.startswith('attention_ext.attentions.')))\n")
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    tools, attentions = result.stdout.splitlines()
    assert tools == "[]"
    assert "'attention_ext.attentions.clustered'" in attentions and "'attention_ext.attentions.lsh'" in attentions


# ---- inside asr/data: rooms ---------------------------------------------------------------------------
# asr/data's rooms, bottom first (asr/docs/data.md, "The modules, in pipeline order"): a folder, or a
# module of asr/data itself; every other module of asr/data stands on top. A room imports its own
# modules and the rooms below it, never a peer or a room above.
DATA_ROOMS = (("audio",), ("corpus", "features"), ("augment", "splits"), ("streaming",), ("batching",),
              ("config",), ("datamodule",))
MAX_ROOM_MODULES = 8


def data_room(dotted: str) -> str:
    """The room of asr.data a dotted name belongs to: asr.data.corpus.manifests -> corpus."""
    return dotted.split(".")[2] if dotted.startswith("asr.data.") else ""


def data_rank(room: str) -> int:
    return next((rank for rank, rooms in enumerate(DATA_ROOMS) if room in rooms), len(DATA_ROOMS))


def imports_against_the_data_rooms(root: Path) -> list[str]:
    """'path:line: room imports asr.data.x (room x, not below it)' for every import of a peer or higher room."""
    found = []
    for path in sorted((root / "asr" / "data").rglob("*.py")):
        module = ".".join(path.relative_to(root).with_suffix("").parts)
        room = data_room(module)
        if room in ("", "__init__"):
            continue
        for line, name in imported_names(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            other = data_room(name)
            if other and other != room and data_rank(other) >= data_rank(room):
                found.append(f"{path.relative_to(root)}:{line}: {room} imports {name} (room {other}, not below it)")
    return found


def crowded_data_rooms(root: Path) -> list[str]:
    """'room: N modules' for every folder of asr/data holding more than MAX_ROOM_MODULES modules."""
    return [f"{folder.name}: {count} modules" for folder in sorted((root / "asr" / "data").iterdir())
            if folder.is_dir() and (count := len([p for p in folder.glob("*.py") if p.name != "__init__.py"]))
            > MAX_ROOM_MODULES]


def test_asr_data_rooms_import_only_the_rooms_below_them_and_hold_eight_modules_at_most():
    rooms = {path.name for path in (REPO / "asr" / "data").iterdir() if (path / "__init__.py").is_file()}
    assert rooms == {room for layer in DATA_ROOMS for room in layer} - {"config", "datamodule"}, \
        "a folder of asr/data that DATA_ROOMS does not place (or one it places that is gone)"
    assert imports_against_the_data_rooms(REPO) == []
    assert crowded_data_rooms(REPO) == []


def test_the_data_room_check_finds_a_peer_import_an_upward_one_and_a_crowded_room(tmp_path):
    for room in ("audio", "corpus", "features", "batching"):
        (tmp_path / "asr" / "data" / room).mkdir(parents=True)
    (tmp_path / "asr" / "data" / "corpus" / "ok.py").write_text("from asr.data.audio.sphere import read_sphere\n")
    (tmp_path / "asr" / "data" / "corpus" / "peer.py").write_text("import asr.data.features.features\n")
    (tmp_path / "asr" / "data" / "audio" / "up.py").write_text(
        "def late():\n    from asr.data.batching.dataset import Batch\n")
    (tmp_path / "asr" / "data" / "datamodule.py").write_text("from asr.data.batching.dataset import Batch\n")
    for index in range(9):
        (tmp_path / "asr" / "data" / "batching" / f"m{index}.py").write_text("from asr.data.config import X\n")
    assert imports_against_the_data_rooms(tmp_path) == [
        "asr/data/audio/up.py:2: audio imports asr.data.batching.dataset (room batching, not below it)",
        *[f"asr/data/batching/m{index}.py:1: batching imports asr.data.config (room config, not below it)"
          for index in range(9)],
        "asr/data/corpus/peer.py:1: corpus imports asr.data.features.features (room features, not below it)",
    ]
    assert crowded_data_rooms(tmp_path) == ["batching: 9 modules"]
