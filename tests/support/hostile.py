"""The hostile-input corpus: a generator of bad, faulty and malicious inputs for the edgekit CLI.

Each :class:`Case` builds its files into its own scratch folder and names the command to run.
``tests/test_hostile.py`` runs every case through the real CLI (``python -m edgekit``, a
subprocess with HOME and TMPDIR inside the scratch folder) and checks what a careful user
would: the exit code, one error line naming the problem (no traceback), no payload run (the
malicious files write a marker file when their code runs), no file outside the scratch folder
changed (each case gets a *victim* folder beside it, with a user's files), and nothing left
behind (no work folder in TMPDIR, no staging sibling).

Placeholders in ``argv``: ``{S}`` the scratch folder, ``{V}`` the victim folder, ``{M}`` the
payload marker path, ``{G}`` the good digits build, ``{B}`` the good digits bundle,
``{MODEL}``, ``{CALIB}``, ``{EVAL}`` the digits example.

The files are built by kind of input: ``hostile_models`` (model files), ``hostile_data`` (data
files), ``hostile_bundles`` (bundles and manifests), ``hostile_payload`` (the pickle whose loading
leaves the marker).

Run ``python tests/support/hostile.py OUT`` to write every case's files into OUT for a look.
"""

from __future__ import annotations

import os
import tarfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from hostile_bundles import bomb_bundle, bundle_with, link, symlink_chain_bundle
from hostile_data import digits_x, npy_header_bomb, npz, npz_bomb, object_npz
from hostile_models import (
    MODEL,
    PREFIX,
    finetune_record_naming,
    finetune_record_wild_ranges,
    flip_byte,
    keras_with_lambda,
    members,
    model_json,
    pt2_with,
    saved_model_touching_files,
    weights_config_pickled,
    write_zip,
)
from hostile_payload import evil_pickle, evil_torch_save


@dataclass
class Case:
    name: str
    group: str  # model | data | options | output | bundle | signal
    argv: list[str]
    stderr: str = ""  # regex the error must match (case-insensitive)
    exit: int | tuple[int, ...] = 2
    build: Callable[[Path, Path, Path], None] | None = None  # (scratch, victim, marker) -> files
    env: dict[str, str] = field(default_factory=dict)
    signal: str | None = None  # TERM | INT | KILL: sent once ``signal_when`` (a glob in the scratch folder) exists
    signal_when: str = ".out.tmp-*"
    needs_mount: bool = False  # the case mounts a tiny tmpfs (root only); skipped where mount is refused
    one_line: bool = True


# ---------------------------------------------------------------- the victim: a user's files beside each case


def make_victim(victim: Path, good_build: Path) -> None:
    (victim / "webapp").mkdir(parents=True)
    (victim / "webapp" / "manifest.json").write_text('{"name": "my web app", "start_url": "/"}\n')
    (victim / "webapp" / "index.html").write_text("<h1>a user's web app</h1>\n")
    (victim / "notes").mkdir()
    (victim / "notes" / "todo.txt").write_text("buy milk\n")
    (victim / "secret.txt").write_text("a host secret that must never reach a board\n")
    import shutil

    shutil.copytree(good_build, victim / "old-build")
    (victim / "old-build" / "my-notes.md").write_text("my notes on this build\n")
    (victim / "evil_runner.py").write_text(
        "import sys\nopen(sys.argv[0] + '.RAN', 'w').write('ran')\n")


# ---------------------------------------------------------------- the cases


def cases() -> list[Case]:
    C = Case
    conv = ["convert", "{MODEL}", "--target", "jetson", "--board", "host"]
    out = ["-o", "{S}/out"]
    int8 = [*conv, "-p", "int8", *out]
    fp32 = [*conv, "-p", "fp32", *out]
    cs: list[Case] = []

    # ---- models: code must not run, damage must be named
    cs += [
        C("pt2_pickled_sample_inputs", "model", [*fp32], r"sample_inputs.*(io|builtins)\.open.*--trust-pickle",
          build=lambda s, v, m: pt2_with(s / "m.pt2", **{"data__sample_inputs__model.pt": evil_torch_save(m)})),
        C("pt2_pickled_sample_inputs_inspect", "model", ["inspect", "{S}/m.pt2"], r"--trust-pickle",
          build=lambda s, v, m: pt2_with(s / "m.pt2", **{"data__sample_inputs__model.pt": evil_torch_save(m)})),
        C("pt2_use_pickle_weight", "model", [*fp32], r"weight_0.*(io|builtins)\.open",
          build=lambda s, v, m: pt2_with(s / "m.pt2", **{"data__weights__weight_0": evil_torch_save(m),
                                                         "data__weights__model_weights_config.json":
                                                             weights_config_pickled("stem.0.weight")})),
        C("pt2_opaque_constant", "model", [*fp32], r"opaque_obj.*pickled Python object",
          build=lambda s, v, m: pt2_with(s / "m.pt2", **{"data__constants__opaque_obj_0": evil_pickle(m)})),
        C("pt2_guard_code", "model", [*fp32], r"guard.*not a plain shape check",
          build=lambda s, v, m: pt2_with(s / "m.pt2", **{"models__model.json": model_json(
              lambda d: d.__setitem__("guards_code", [f"open({str(m)!r}, 'w') is not None"]))})),
        C("pt2_sympy_range_key", "model", [*fp32], r"shape expression.*not plain arithmetic",
          build=lambda s, v, m: pt2_with(s / "m.pt2", **{"models__model.json": model_json(
              lambda d: d.__setitem__("range_constraints", {f"open({str(m)!r}, 'w')": {
                  "min_val": 1, "max_val": 2}}))})),
        C("pt2_crc_flipped_weight", "model", [*fp32], r"weight_8 fails its CRC",
          build=lambda s, v, m: flip_byte(MODEL, s / "m.pt2", PREFIX + "data/weights/weight_8")),
        C("pt2_weight_cut_short", "model", [*fp32], r"weight_8 holds 1,000 bytes, tensor .* needs 36,864.*cut short",
          build=lambda s, v, m: pt2_with(s / "m.pt2", **{"data__weights__weight_8": members()[
              PREFIX + "data/weights/weight_8"][:1000]})),
        C("pt2_truncated", "model", [*fp32], r"not a torch archive.*truncated",
          build=lambda s, v, m: (s / "m.pt2").write_bytes(MODEL.read_bytes()[: MODEL.stat().st_size // 2])),
        # its last 23 bytes cut: zipfile still finds an older end record inside a member and reads another archive
        C("pt2_cut_23_bytes", "model", [*fp32], r"truncated or corrupt: a zip whose central directory is missing",
          build=lambda s, v, m: (s / "m.pt2").write_bytes(MODEL.read_bytes()[:-23])),
        C("pt2_empty", "model", [*fp32], r"is empty", build=lambda s, v, m: (s / "m.pt2").write_bytes(b"")),
        C("pt2_garbage", "model", [*fp32], r"not a torch archive",
          build=lambda s, v, m: (s / "m.pt2").write_bytes(os.urandom(4096))),
        C("pt2_zip_bomb", "model", [*fp32], r"expand.*GiB.*zip bomb",
          build=lambda s, v, m: write_zip(s / "m.pt2", {**members(), PREFIX + "data/weights/weight_99":
                                                        b"\0" * (300 << 20)}, zipfile.ZIP_DEFLATED)),
        C("pickled_module_pt", "model", [*conv, "-p", "fp32", "--input-shape", "1,1,8,8", *out],
          r"imports (io|builtins)\.open.*--trust-pickle",
          build=lambda s, v, m: (s / "m.pt").write_bytes(evil_torch_save(m))),
        C("onnx_truncated", "model", [*fp32], r"not a valid ONNX model",
          build=lambda s, v, m: (s / "m.onnx").write_bytes(b"\x08\x07\x12\x04torch\x1a" + os.urandom(64))),
        C("keras_not_a_zip", "model", ["convert", "{S}/m.keras", "--target", "android", *out],
          r"not a Keras archive", build=lambda s, v, m: (s / "m.keras").write_bytes(b"not a zip")),
        C("unknown_model_suffix", "model", ["convert", "{S}/m.txt", *out], r"unknown model file type",
          build=lambda s, v, m: (s / "m.txt").write_text("hello")),
        # a finetune record names the float model the .pt2 came from: one naming a user's file, with fields of the
        # wrong types, is not loaded (the sha256 does not match) and breaks nothing; the build stands (exit 0)
        C("pt2_finetune_record_names_a_victim_file", "model", [*fp32, "--calib", "{CALIB}", "--eval", "{EVAL}"],
          r"", exit=0, one_line=False, build=finetune_record_naming),
        C("pt2_finetune_record_wild_student_ranges", "model",
          [*int8, "--calib", "{CALIB}", "--option", "student_ranges=on"],
          r"is\s+not\s+there.*changed\s+since\s+fine-tuning", exit=2, one_line=False,
          build=finetune_record_wild_ranges),
        C("model_missing", "model", ["convert", "{S}/none.pt2", *out], r"no such file"),
        C("model_is_folder", "model", ["convert", "{S}", *out], r"folder without saved_model\.pb"),
    ]
    for c in cs:  # the crafted model is the one converted
        c.argv = [a if a != "{MODEL}" else ("{S}/m.pt" if c.name == "pickled_module_pt" else
                                            "{S}/m.onnx" if c.name == "onnx_truncated" else "{S}/m.pt2")
                  for a in c.argv]

    # ---- TensorFlow: a SavedModel is code (graph ops run), a Keras Lambda is Python
    android = ["--target", "android", "-p", "fp32", *out]
    cs += [
        C("savedmodel_writes_file", "model", ["convert", "{S}/sm", *android], r"WriteFile.*--trust-pickle",
          build=lambda s, v, m: saved_model_touching_files(s / "sm", m)),
        C("savedmodel_reads_secret", "model", ["convert", "{S}/sm", *android], r"ReadFile.*--trust-pickle",
          build=lambda s, v, m: saved_model_touching_files(s / "sm", m, read=v / "secret.txt")),
        C("keras_lambda", "model", ["convert", "{S}/lam.keras", *android], r"Lambda layer.*--trust-pickle",
          build=lambda s, v, m: keras_with_lambda(s / "lam.keras", m)),
        # jetson / ios take TensorFlow models through tf2onnx now: loaded (and refused) the same way before it
        C("savedmodel_writes_file_jetson", "model", ["convert", "{S}/sm", "--target", "jetson", *out],
          r"WriteFile.*--trust-pickle", build=lambda s, v, m: saved_model_touching_files(s / "sm", m)),
        C("keras_lambda_ios", "model", ["convert", "{S}/lam.keras", "--target", "ios", *out],
          r"Lambda layer.*--trust-pickle", build=lambda s, v, m: keras_with_lambda(s / "lam.keras", m)),
    ]

    # ---- data: bounded by header, numbers only, finite, labels that fit the model
    def calib_case(name: str, want: str, make: Callable[[Path, Path], Path], flag: str = "--calib",
                   extra: list[str] | None = None, env: dict | None = None) -> Case:
        argv = [*int8, flag, "{S}/d.npz"] if flag == "--calib" else [*conv, "-p", "fp32", *out, "--eval", "{S}/d.npz"]
        return C(name, "data", argv + (extra or []), want, build=lambda s, v, m: make(s / "d.npz", m), env=env or {})

    x = digits_x
    cs += [
        calib_case("calib_object_array", r"holds Python objects.*never unpickles", lambda p, m: object_npz(p, m)),
        calib_case("calib_nan", r"'x'.*non-finite.*NaN", lambda p, m: npz(p, x=np.where(x() > 0.5, np.nan, x()))),
        calib_case("calib_inf", r"non-finite.*Inf", lambda p, m: npz(p, x=np.where(x() > 0.5, np.inf, x()))),
        calib_case("calib_complex", r"is complex", lambda p, m: npz(p, x=x().astype(np.complex64))),
        calib_case("calib_too_large_for_int8", r"'x'.*too large for INT8 calibration.*overflow float32",
                   lambda p, m: npz(p, x=np.full_like(x(), 3e38))),
        calib_case("calib_strings", r"dtype <U", lambda p, m: npz(p, x=np.full((4, 1, 8, 8), "a"))),
        calib_case("calib_wrong_shape", r"has shape \[32, 64\].*expects \[N, 1, 8, 8\]",
                   lambda p, m: npz(p, x=x().reshape(32, 64))),
        calib_case("calib_bomb_2gib", r"expands to 2,147\.5 MB.*--max-data-mb", lambda p, m: npz_bomb(p, 2.0)),
        calib_case("calib_npy_header_1e12", r"expands to .*MB.*limit", lambda p, m: npy_header_bomb(p, 10**12)),
        calib_case("calib_truncated", r"not a readable \.npz",
                   lambda p, m: p.write_bytes(npz(p, x=x()).read_bytes()[:300])),
        calib_case("calib_over_lowered_limit", r"expands to 8.2 KB, over the 1 KB limit", lambda p, m: npz(p, x=x()),
                   extra=["--max-data-mb", "0.001"]),
        calib_case("calib_missing", r"no such file", lambda p, m: p),
        calib_case("eval_labels_strings", r"'label' has dtype <U", lambda p, m: npz(p, x=x(), label=np.array(["a"] * 32)),
                   flag="--eval"),
        calib_case("eval_labels_fractional", r"fractional", lambda p, m: npz(p, x=x(), label=np.full(32, 0.5)),
                   flag="--eval"),
        calib_case("eval_labels_negative", r"negative", lambda p, m: npz(p, x=x(), label=-np.ones(32, np.int64)),
                   flag="--eval"),
        calib_case("eval_labels_out_of_range", r"class 10.*10 classes", lambda p, m: npz(p, x=x(), label=np.full(32, 10)),
                   flag="--eval"),
        calib_case("eval_labels_count", r"31 labels for 32 samples", lambda p, m: npz(p, x=x(), label=np.zeros(31, int)),
                   flag="--eval"),
        calib_case("eval_all_nan", r"non-finite", lambda p, m: npz(p, x=np.full((32, 1, 8, 8), np.nan, np.float32),
                                                                 label=np.zeros(32, int)), flag="--eval"),
    ]

    # ---- options: checked before any work
    cs += [
        C("golden_zero", "options", [*fp32, "--golden", "0"], r"--golden 0.*at least 1"),
        C("golden_negative", "options", [*fp32, "--golden", "-5"], r"--golden -5"),
        C("opset_negative", "options", [*fp32, "--opset", "-1"], r"--opset -1.*from 7"),
        C("opset_huge", "options", [*fp32, "--opset", "99"], r"--opset 99"),
        C("option_keep_float_nodes_int", "options", [*fp32, "--option", "keep_float_nodes=3"],
          r"keep_float_nodes=3.*node names"),
        C("option_garbage", "options", [*fp32, "--option", "garbage"], r"--option 'garbage': expected key=value"),
        C("option_unknown_key", "options", [*fp32, "--option", "turbo=1"], r"--option turbo: not an option.*takes"),
        C("option_bad_bool", "options", [*fp32, "--option", "allow_float_fallback=maybe"],
          r"allow_float_fallback=maybe.*boolean.*it takes"),
        C("option_bad_choice", "options", ["convert", "{MODEL}", "--target", "android", "--option", "io=int4", *out],
          r"io=int4.*int8 or float"),
        C("precision_unknown", "options", [*conv, "-p", "int3", *out], r"precision 'int3'"),
        C("target_unknown", "options", ["convert", "{MODEL}", "--target", "toaster", *out], r"known targets"),
        C("board_unknown", "options", ["convert", "{MODEL}", "--board", "jetson-tx9", *out], r"known boards"),
        C("input_shape_garbage", "options", [*fp32, "--input-shape", "1,x,8"], r"--input-shape"),
        C("set_nan", "options", ["boards", "show", "jetson-orin-nano-8gb", "--set", "ram_mb=nan"], r"ram_mb"),
        C("plan_ram_nan", "options", ["plan", "{MODEL}", "--board", "host", "--max-ram-mb", "nan"],
          r"--max-ram-mb must be a finite positive"),
        C("plan_latency_inf", "options", ["plan", "{MODEL}", "--board", "host", "--max-latency-ms", "inf"],
          r"--max-latency-ms must be a finite positive"),
        C("plan_power_negative", "options", ["plan", "{MODEL}", "--board", "host", "--max-power-w", "-3"],
          r"--max-power-w must be"),
        C("max_data_mb_nan", "options", [*int8, "--calib", "{CALIB}", "--max-data-mb", "nan"],
          r"--max-data-mb nan"),
    ]

    # ---- output folders: only edgekit's own outputs are ever replaced
    cs += [
        C("out_is_user_webapp", "output", [*fp32[:-2], "-o", "{V}/webapp"], r"holds files edgekit did not write.*index\.html"),
        C("out_is_old_build_with_notes", "output", [*fp32[:-2], "-o", "{V}/old-build"], r"did not write.*my-notes\.md"),
        C("out_is_user_notes_folder", "output", [*fp32[:-2], "-o", "{V}/notes"], r"did not write.*todo\.txt"),
        C("out_is_a_file", "output", [*fp32[:-2], "-o", "{V}/secret.txt"], r"is not a folder"),
        C("out_below_a_file", "output", [*fp32[:-2], "-o", "{V}/secret.txt/out"], r"not a folder"),
        C("out_unwritable", "output", [*fp32[:-2], "-o", "/proc/edgekit-out"], r"cannot write in /proc"),
        C("out_full_filesystem", "output", [*fp32[:-2], "-o", "{S}/full/out"], r"no space left", needs_mount=True),
        C("plan_report_into_user_folder", "output", ["plan", "{MODEL}", "--board", "host", "-o", "{V}/notes"],
          r"did not write.*todo\.txt"),
    ]

    # ---- bundles and manifests: nothing runs or leaves the bundle, nothing of the user's is deleted
    flash = ["flash", "{S}/b.tar.gz", "--board", "host"]
    smoke = ["smoke", "{S}/b.tar.gz"]

    def bcase(name: str, argv: list[str], want: str, make: Callable[[Path, Path, Path, Path], object],
              **kw) -> Case:
        return C(name, "bundle", argv, want, build=lambda s, v, m: make(s / "b.tar.gz", s, v, m), **kw)

    def set_(path: list[str], value):
        def edit(man: dict) -> None:
            node = man
            for k in path[:-1]:
                node = node[k]
            node[path[-1]] = value
        return edit

    def drop(path: list[str]):
        def edit(man: dict) -> None:
            node = man
            for k in path[:-1]:
                node = node[k]
            del node[path[-1]]
        return edit

    good = Path("{B}")
    cs += [
        bcase("runner_entry_outside", smoke, r"runner\.entry.*not a file of the bundle",
              lambda p, s, v, m: bundle_with(p, _good(s), set_(["runner", "entry"], f"../../../{v.name}/evil_runner.py"))),
        bcase("runner_python_is_sh", smoke, r"runner\.python.*python interpreter",
              lambda p, s, v, m: bundle_with(p, _good(s), set_(["runner", "python"], "sh"))),
        bcase("name_escapes_home", flash, r"manifest field 'name'",
              lambda p, s, v, m: bundle_with(p, _good(s), set_(["name"], f"../../../{v.name}"))),
        bcase("flash_dest_user_folder", [*flash, "--dest", "{V}/notes"], r"did not write.*todo\.txt",
              lambda p, s, v, m: _copy(_good(s), p)),
        bcase("flash_dest_old_build_with_notes", [*flash, "--dest", "{V}/old-build"], r"did not write.*my-notes",
              lambda p, s, v, m: _copy(_good(s), p)),
        bcase("flash_dest_home", [*flash, "--dest", "~"], r"whole folder tree",
              lambda p, s, v, m: _copy(_good(s), p)),
        bcase("symlink_chain_leak", flash, r"outside the bundle",
              lambda p, s, v, m: symlink_chain_bundle(p, _good(s), v / "secret.txt")),
        bcase("gz_bomb_default_limit", flash, r"unpacks to 1,100 MiB.*1,024 MiB limit.*--max-bundle-mb",
              lambda p, s, v, m: bomb_bundle(p, _good(s), 1100 << 20)),
        bcase("gz_bomb_lowered_limit", [*flash, "--max-bundle-mb", "16"], r"over the 16 MiB limit",
              lambda p, s, v, m: bomb_bundle(p, _good(s), 64 << 20)),
        bcase("member_size_lies", flash, r"member run\.py is .* the manifest says 1",
              lambda p, s, v, m: bundle_with(p, _good(s), set_(["files", "run.py", "bytes"], 1))),
        bcase("manifest_huge", flash, r"manifest\.json is 20\.0 MiB",
              lambda p, s, v, m: bundle_with(p, _good(s), set_(["padding"], "x" * (20 << 20)))),
        bcase("manifest_not_json", flash, r"not valid JSON",
              lambda p, s, v, m: bundle_with(p, _good(s), raw_manifest=b"{not json")),
        bcase("manifest_is_list", flash, r"JSON list, not an edgekit manifest",
              lambda p, s, v, m: bundle_with(p, _good(s), raw_manifest=b"[1, 2]")),
        bcase("manifest_no_sha256", flash, r"files\.run\.py\.sha256",
              lambda p, s, v, m: bundle_with(p, _good(s), drop(["files", "run.py", "sha256"]))),
        bcase("manifest_no_board", flash, r"'board' is missing",
              lambda p, s, v, m: bundle_with(p, _good(s), drop(["board"]))),
        bcase("manifest_bad_schema", flash, r"'schema_version' is 7",
              lambda p, s, v, m: bundle_with(p, _good(s), set_(["schema_version"], 7))),
        bcase("manifest_unknown_field", flash, r"'padding2' is not an edgekit manifest field",
              lambda p, s, v, m: bundle_with(p, _good(s), set_(["padding2"], 1))),
        bcase("bundle_cut_in_half", flash, r"truncated or damaged",
              lambda p, s, v, m: p.write_bytes(_good(s).read_bytes()[: _good(s).stat().st_size // 2])),
        bcase("bundle_not_a_tar", flash, r"not a readable tar archive", lambda p, s, v, m: p.write_bytes(os.urandom(999))),
        bcase("bundle_unlisted_file", flash, r"does not list.*stowaway\.sh",
              lambda p, s, v, m: bundle_with(p, _good(s), extra=[(tarfile.TarInfo("stowaway.sh"), b"rm -rf ~\n")])),
        bcase("bundle_path_traversal", flash, r"climbs out",
              lambda p, s, v, m: bundle_with(p, _good(s), first=[(tarfile.TarInfo("../escaped.txt"), b"x")])),
        bcase("bundle_absolute_member", flash, r"absolute path",
              lambda p, s, v, m: bundle_with(p, _good(s), first=[(tarfile.TarInfo(f"{v}/dropped.txt"), b"x")])),
        bcase("bundle_link_out", flash, r"outside the bundle",
              lambda p, s, v, m: bundle_with(p, _good(s), first=[link("l", f"{v}/secret.txt")])),
        bcase("bundle_missing", ["flash", "{S}/none.tar.gz", "--board", "host"], r"does not exist",
              lambda p, s, v, m: None),
    ]
    del good

    # ---- signals: a killed run leaves nothing behind (TERM/INT at once, KILL at the next run); --no-cache: a build
    # another case of the corpus stored would come from the cache before there is anything to kill
    cs += [
        C("sigterm_mid_convert", "signal", [*int8, "--calib", "{CALIB}", "--no-cache"], "", exit=(143, -15), signal="TERM",
          one_line=False),
        C("sigint_mid_convert", "signal", [*int8, "--calib", "{CALIB}", "--no-cache"], "", exit=(1, 130, -2), signal="INT",
          one_line=False),
        C("sigkill_then_next_run_sweeps", "signal", [*int8, "--calib", "{CALIB}", "--no-cache"], r"removed \d+ folder",
          exit=0, signal="KILL", one_line=False),
        C("sigkill_mid_flash_unpack_then_next_run_sweeps", "signal", ["flash", "{S}/b.tar.gz", "--board", "host"],
          r"removed \d+ folder", exit=0, signal="KILL", signal_when="tmp/edgekit-bundle-*/*", one_line=False,
          build=lambda s, v, m: bomb_bundle(s / "b.tar.gz", _good(s), 400 << 20)),
    ]
    return cs


def _good(scratch: Path) -> Path:
    """The good digits bundle, copied into the case's scratch folder by the runner."""
    return scratch / "good.tar.gz"


def _copy(src: Path, dest: Path) -> Path:
    dest.write_bytes(src.read_bytes())
    return dest


if __name__ == "__main__":  # pragma: no cover - write the corpus for a look
    import sys

    base = Path(sys.argv[1] if len(sys.argv) > 1 else "hostile-corpus")
    for c in cases():
        s = base / c.name
        s.mkdir(parents=True, exist_ok=True)
        print(c.group, c.name, " ".join(c.argv))
