"""The build report (``report.md``): rendered from the manifest, beside ``report_html.py`` (the plan's report)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from edgekit.units import fmt_bytes as fmt_size  # the one size format of reports and the CLI

if TYPE_CHECKING:  # pragma: no cover
    from edgekit.analyze import ModelStats


def _ci(ci: Any) -> str:
    """", 95% CI 93.1–99.6%" from a Wilson interval; empty when there is none."""
    return f", 95% CI {ci[0]:.1%}–{ci[1]:.1%}" if ci else ""


def near_ties(m: dict[str, Any]) -> str:
    """"2 near-tie flips count as agreeing" (or ""): the flips the class bar did not count (check_output's
    near-ties), as report.md and the CLI's table say it."""
    n = int(m.get("near_tie_disagreements") or 0)
    return f"{n} near-tie flip{'s' if n > 1 else ''} count{'' if n > 1 else 's'} as agreeing" if n else ""


def _ties(m: dict[str, Any]) -> str:
    return f"; {near_ties(m)}" if near_ties(m) else ""


def _metric(o: dict[str, Any], tol: dict[str, Any]) -> str:
    m = o.get("metrics") or {}
    if o.get("kind") in ("detection", "detection_cf") and "iou" in m:
        need = f" (≥ {tol['min_snr_db']:g} dB)" if tol.get("min_snr_db") is not None else ""
        return (f"detections IoU {m['iou']:.3f} (≥ {tol.get('min_iou', 0.9):g}), "
                f"boxes SNR {m.get('snr_db', float('inf')):.1f} dB{need}")
    if o.get("kind") == "ctc" and "text_agreement" in m:
        return (f"text matches on {m['text_agreement']:.1%}, CER {m.get('cer', 0):.2%}, "
                f"confidence ±{m.get('confidence_max_diff', 0):.3f}")
    if "snr_db" in m:
        need = f" (≥ {tol['min_snr_db']:g} dB)" if tol.get("min_snr_db") is not None else ""
        return f"SNR {m['snr_db']:.1f} dB{need}, cosine {m.get('cosine', float('nan')):.5f}"
    if "iou" in m:
        return f"IoU {m['iou']:.3f} (≥ {tol.get('min_iou', 0.9):g})"
    if o.get("kind") == "mask":
        return "no sample reaches 0.5 in either model: judged by max error"
    if o.get("kind") in ("detection", "detection_cf"):
        return "nothing detected in either model: judged by max error"
    if "exact_match" in m:
        return f"exact {m['exact_match']:.1%} (≥ {tol.get('min_exact', 0.99):.0%})"
    if "top5_agreement" in m:
        return f"top-5 {m['top5_agreement']:.1%}"
    return "—"


def _selection(sel: dict[str, Any] | None) -> str:
    if not sel:
        return ""
    held = sel.get("held_out_of_calibration") or 0
    if sel.get("in_order"):  # --carry: a sequence of chunks, in order
        a, b = sel["sequence"]
        return (f" (chunks {a} to {b - 1} in order, the start of the file's last sequence"
                + ("; held out of calibration" if held else "") + ")")
    how = "stratified by label" if sel.get("stratified") else "uniformly"
    return (f" (drawn across the file {how}, seed {sel.get('seed')}"
            + (f"; {held} samples held out of calibration" if held else "") + ")")


def _budgets(man: dict[str, Any]) -> list[str]:
    """The plan's estimate beside the board's budgets: the same figures `edgekit plan` prints, the runtime's own
    RAM on a line of its own, and the power mode named."""
    from edgekit.planner import BUDGET_NAMES, fmt_budget

    b, plan = man["budgets"], man.get("plan") or {}
    est = plan.get("estimate") or {}
    overhead = b.get("runtime_overhead_mb")
    mode = plan.get("power_mode") or man["board"].get("default_power_mode")
    watts = ((man["board"].get("profile") or {}).get("power_modes") or {}).get(mode, {}).get("power_w")
    by = "chosen by the planner" if plan.get("chosen_by") == "planner" else "the board's default"
    out = ["## Budgets and the plan's estimate", "",
           f"Power mode **{mode}**" + (f" ({watts:g} W)" if watts is not None else "") + f", {by}.", "",
           "| | estimate | budget |", "|---|---|---|"]

    def row(name: str, key: str, e: float | None, lim: float | None) -> None:
        out.append(f"| {name} | {'—' if e is None else fmt_budget(key, e, 4)} | {'—' if lim is None else fmt_budget(key, lim)} |")

    ram = est.get("ram_mb")
    row("RAM, whole process", "ram_mb", ram, b.get("ram_mb"))
    if overhead is not None:
        row("· runtime overhead", "ram_mb", overhead, overhead)
        row("· model (weights + activations)", "ram_mb", None if ram is None else ram - overhead,
            None if b.get("ram_mb") is None else round(b["ram_mb"] - overhead, 3))
    for key in ("storage_mb", "latency_ms", "power_w", "energy_mj"):
        row(BUDGET_NAMES[key], key, est.get(key), b.get(key))
    return out + [""]


def _mixed_precision(art: dict[str, Any]) -> list[str]:
    """INT8 calibration as chosen, the mixed-precision search (edgekit.mixed.fallback) where plain INT8 failed, and
    its last step: the build with 16-bit activations (android's 16x8)."""
    lines = _mixed_layers(art)
    a16 = (art.get("mixed_precision") or {}).get("activations16")
    if not a16:
        return lines
    if not a16.get("built"):
        return lines + ["", f"16-bit activations (the last step) did not build: {a16.get('reason')}."]
    lat = a16.get("host_latency_ms_1_thread") or {}
    agree = a16.get("eval_top1_agreement") or {}
    cost = (f" Host latency {lat['int16_activations']:.3f} ms against {lat['int8']:.3f} ms for the int8 build (1 "
            "thread; XNNPACK has no int16 kernels)." if lat.get("int8") and lat.get("int16_activations") else "")
    search = a16.get("layer_search") or {}
    kept = search.get("kept") or []
    searched = ""
    if search.get("searched") is False:
        searched = f" Its layer search did not run: {search['reason']}."
    elif "scanned" in search:
        searched = (f" Every activation 16-bit failed verification first, so its ops were searched on "
                    f"{search['search_samples']} calibration samples ({search['builds']} builds, "
                    f"{search['seconds']:.1f} s): output SNR {search['snr_db_before']:.1f} dB → "
                    f"{search['snr_db_after']:.1f} dB with {len(kept)} op(s) kept float"
                    + (" (the table below)." if search["scanned"] else "."))
    return lines + ["", "Last step: every activation 16-bit, weights int8 (TFLite 16x8, ai-edge-quantizer), "
                    f"{a16['seconds']:.1f} s: re-verification **{'passed' if a16['passed'] else 'FAILED'}**"
                    + ("" if a16["passed"] else f" ({'; '.join(a16['failures'])[:400]}), so the int8 build above "
                       "stands")
                    + (". Eval agreement with float: " + ", ".join(f"{k} {v:.2%}" for k, v in agree.items())
                       if agree else "") + "." + searched + cost] + _layer_table(search)


def _layer_table(mp: dict[str, Any]) -> list[str]:
    """The search's measured layers (and the kept ones) as a table, then its plot."""
    if not mp.get("scanned") and not mp.get("kept"):
        return []
    lines = ["", "| layer | op | rank SQNR (dB) | output SNR kept alone (dB) | gain (dB) | kept |",
             "|---|---|---|---|---|---|"]
    kept = {k["name"] for k in mp["kept"]}
    shown = mp["scanned"] + [k for k in mp["kept"] if k["name"] not in {s["name"] for s in mp["scanned"]}]
    for lay in shown:
        fmt = (lambda x: "—" if x is None else f"{x:.1f}")
        lines.append(f"| {lay['name']} | {lay['op']} | {lay['local_sqnr_db']:.1f} | {fmt(lay['alone_snr_db'])} | "
                     f"{fmt(lay['gain_db'])} | {'yes' if lay['name'] in kept else ''} |")
    if mp.get("plot"):
        lines += ["", f"![per-layer sensitivity]({mp['plot']})"]
    return lines


def _mixed_layers(art: dict[str, Any]) -> list[str]:
    q = art.get("quantization") or {}
    lines = []
    if q.get("calibration_measured_snr_db"):
        lines += ["", "## INT8 calibration", "", f"Method **{q['calibration_method']}**, {q['calibration_chosen']}: "
                  + ", ".join(f"{k} {v:.1f} dB" for k, v in q["calibration_measured_snr_db"].items()) + "."]
    mp = art.get("mixed_precision")
    if not mp:
        return lines
    if mp.get("searched") is False:
        return lines + ["", "## Mixed precision", "", f"Plain INT8 failed verification; not searched: {mp['reason']}."]
    failed = f"Plain INT8 failed verification ({'; '.join(mp['int8_verification_failures'])}). "
    group = mp.get("group")  # a group kept float before the layer search: manifests of earlier 0.1 builds (android's
    # int8 LSTMs) record it; no converter makes that step now
    lines += ["", "## Mixed precision", ""]
    if group:
        lines.append(failed + f"Built again with {group['kept']} ({group['seconds']:.1f} s): re-verification "
                     + ("**passed**." if group["passed"] else f"still failed ({'; '.join(group['failures'])}), so "
                        "its layers were searched."))
        if "scanned" not in mp:
            return lines
        lines.append("")
        failed = ""
    shown = mp.get("shown", bool(mp["scanned"]))  # a record without it: an empty scan meant the samples passed
    if not shown and not mp["kept"]:
        return lines + [failed + f"All-INT8 passes the checks on the {mp['search_samples']} calibration samples the "
                        "search uses: they cannot show which layers fail, and no layer gains output SNR there kept "
                        "alone, so none was kept and the build stays failed."]
    unshown = ("" if shown else
               " All-INT8 passes the checks on these samples, so layers were kept by the output SNR they gain there "
               "and each set re-verified on the golden samples.")
    stopped = f"; stopped: {mp['stopped']}" if mp.get("stopped") else ""
    cached = mp.get("scores_from_cache")
    if cached:
        stopped += (f"; sensitivity scores of {cached['layers']} layers from the cache, saved {cached['saved_s']:.1f} s")
    lines += [failed + f"Searched on {mp['search_samples']} calibration samples ({mp['builds']} builds, "
              f"{mp['seconds']:.1f} s{stopped}): output SNR {mp['snr_db_before']:.1f} dB all-INT8 → "
              f"{mp['snr_db_after']:.1f} dB with {len(mp['kept'])} layer(s) kept {mp['keeps_as']}.{unshown} Re-verification: "
              f"**{'passed' if mp['passed_after'] else 'FAILED'}**"
              + (" (the int8 build; the last step below)." if mp.get("activations16") else " (the table above).")]
    return lines + _layer_table(mp)


def _result(o: dict[str, Any]) -> str:
    """An output's verdict in the table: pass, pass with its max error warned (the task metric decided), FAIL."""
    if not o["passed"]:
        return "FAIL"
    return "pass (max error over its tolerance: warning, see below)" if o.get("warnings") else "pass"


def _carried(c: dict[str, Any] | None) -> list[str]:
    """--carry: the float and the converted model each over the golden sequence with its own state."""
    if not c:
        return []
    pairs = ", ".join(f"`{p['output']}` → `{p['input']}`" for p in c["pairs"])
    out = ["", f"### Carried state ({pairs})", "",
           (f"The float and the converted model each run the {c['chunks']} golden chunks in order, each carrying "
            "its own state from chunk to chunk (from a zero state); error of a chunk: max |converted − float| over "
            "the output's range on the sequence (per chunk in manifest.json, `verification.carried`)."), "",
           ("| output | first chunk | last chunk | mean, first quarter | mean, last quarter | max (chunk) | "
            "tolerance | top-1 agreement | result |"), "|---|---|---|---|---|---|---|---|---|"]
    for name, o in c["outputs"].items():
        agree = f"{o['top1_agreement']:.1%}" if "top1_agreement" in o else "—"
        out.append(f"| {name}{' (state)' if o['state'] else ''} | {o['first_chunk_rel_error']:.3%} | "
                   f"{o['last_chunk_rel_error']:.3%} | {o['first_quarter_mean_rel_error']:.3%} | "
                   f"{o['last_quarter_mean_rel_error']:.3%} | {o['max_rel_error']:.3%} ({o['worst_chunk']}) | "
                   f"{o['tolerance_rel']:.2%} | {agree} | {'pass' if o['passed'] else 'FAIL'} |")
    return out


def render_report(man: dict[str, Any], stats: ModelStats) -> str:
    v = man["verification"]
    lines = [
        f"# edgekit conversion report: {man['name']}",
        "",
        f"- source: `{man['source_model']['path']}` ({man['source_model']['kind']}, sha256 {man['source_model']['sha256'][:12]}…)",
        *[f"- prepared: {step}" for step in man["source_model"].get("prepared") or []],
        *([f"- rebuilt in torch by {man['source_model']['bridge']} for this target's converter; the float "
           "reference is onnxruntime on the prepared graph"] if man["source_model"].get("bridge") else []),
        *([f"- fine-tuned (edgekit finetune, {ft['recipe'].get('target')} INT8 in the loop) from `{ft['path']}` "
           f"(sha256 {ft['sha256'][:12]}…)"] if (ft := man["source_model"].get("finetuned_from")) else []),
        *([f"- measured {ao['summary']}"] if (ao := v.get("against_original")) else []),
        f"- target: **{man['target']}** ({man['format']}), precision **{man['precision']}**",
        f"- board: **{man['board']['id']}** — {man['board']['description']}",
        f"- verification: **{'PASSED' if v['passed'] else 'FAILED'}** with {v['runtime']} on {v['golden_samples']} golden samples from `{v['golden_source']}`"
        + _selection(man["golden"].get("selection")),
        "",
        "## Host verification (artifact vs " + ("the float model it was fine-tuned from, which its student's "
                                                 "activation ranges imitate)" if v.get("reference_model")
                                                 else "float model)"),
        "",
        "| output | kind | max abs error | max rel error | tolerance | top-1 agreement | kind's metric | worst sample | result |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    tol = man.get("tolerance") or {}
    for o in v["outputs"]:
        agree = "—" if o["top1_agreement"] is None else (
            f"{o['top1_agreement']:.1%} (≥ {o['min_top1_agreement']:.0%}){_ci(o.get('top1_agreement_ci95'))}"
            + _ties(o.get("metrics") or {}))
        floor = f" (floor {tol['abs_floor']:.3g})" if tol.get("abs_floor") else ""
        worst = "—" if o.get("worst_sample") is None else str(o["worst_sample"])
        lines.append(
            f"| {o['name']} | {o.get('kind', '—')} | {o['max_abs_error']:.4g} | {o['max_rel_error']:.3%} | "
            f"{o['tolerance_rel']:.2%}{floor} | {agree} | {_metric(o, tol)} | {worst} | {_result(o)} |"
        )
    if v["float_accuracy"] is not None:
        drop = 100 * (v["float_accuracy"] - v["converted_accuracy"])
        lines += ["", f"Accuracy on {v['eval_samples']} eval samples: float **{v['float_accuracy']:.2%}**"
                  f"{_ci(v.get('float_accuracy_ci95'))}, {man['precision']} **{v['converted_accuracy']:.2%}**"
                  f"{_ci(v.get('converted_accuracy_ci95'))} (drop {drop:.2f} points, "
                  f"tolerance {v['max_accuracy_drop_points']}). The 95% intervals (Wilson) say what "
                  f"{v['eval_samples']} samples can tell."]
        if v.get("accuracy_drop_ci95"):
            lo, hi = v["accuracy_drop_ci95"]
            lines[-1] += (f" On the same samples the drop is {drop:.2f} points, paired 95% CI {lo:.2f} to {hi:.2f}: "
                          f"{man['precision']} gets {v['accuracy_lost']} wrong that float gets right, and "
                          f"{v['accuracy_won']} right that float gets wrong.")
    lines += _carried(v.get("carried"))
    if v["failures"]:
        lines += ["", "### Failures", ""] + [f"- {f}" for f in v["failures"]]
    lines += _mixed_precision(man["artifact"])
    a, prim = man["analysis"], man["artifact"]["primary"]
    lines += [
        "",
        "## Model",
        "",
        f"- parameters: {a['params']:,} ({a['weight_params']:,} in conv/linear weights), MACs: {a['macs']:,}",
        "- weight bytes: " + ", ".join(f"{k} {fmt_size(b)}" for k, b in a["weight_bytes"].items()),
        f"- peak live activations: {fmt_size(a['peak_activation_bytes'])} (sum of all activations {fmt_size(a['total_activation_bytes'])})",
        f"- artifact: `{prim}` {fmt_size(sum(f['bytes'] for k, f in (man.get('files') or {}).items() if k == prim or k.startswith(prim + '/')))}",
        "",
        *_budgets(man),
        ("This machine is the board: the smoke test (`python3 run.py` in the bundle) measures latency, RAM and "
         "power here." if man["board"]["id"] == "host/host" else
         "The smoke test (`python3 run.py` in the bundle) measures latency, RAM and power on the board."),
    ]
    eng = man["artifact"].get("engine")
    if eng is not None and not eng.get("built"):
        lines += ["", "## TensorRT engine", "", f"Not built on this host: {eng['reason']}. On the board: `./build_engine.sh` "
                  "(trtexec from JetPack), then `python3 run.py`."]
    if man["warnings"] or man["notes"]:
        lines += ["", "## Warnings and notes", ""] + [f"- {w}" for w in man["warnings"] + man["notes"]]
    lines += ["", "## Stage times", "", ", ".join(f"{k} {t:.2f} s" for k, t in man["timings_s"].items()), ""]
    return "\n".join(lines)
