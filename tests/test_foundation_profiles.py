"""Every shipped profile validates, values are checked, --set overrides work."""

from __future__ import annotations

import pytest

from edgekit.errors import ProfileError
from edgekit.profiles import board_files, list_targets, load_board, load_target, parse_overrides, target_files


@pytest.mark.parametrize("name", sorted(board_files()))
def test_every_shipped_board_validates(name):
    b = load_board(name)
    assert b.id == name
    assert b.precisions, name
    for t in b.targets:
        assert t in target_files(), f"{name} names unknown target {t}"
    # default budgets must be reachable on the board's own figures
    assert b.budgets.model_ram_share * b.ram_mb > 0
    assert b.budgets.power_w <= max(m.power_w for m in b.power_modes.values())


@pytest.mark.parametrize("name", sorted(target_files()))
def test_every_shipped_target_validates(name):
    t = load_target(name)
    assert t.default_precision in t.precisions


def test_jetson_boards_are_the_four_asked_for():
    jetsons = {k for k in board_files() if k.startswith("nvidia/")}
    assert {"nvidia/jetson-orin-nano-8gb", "nvidia/jetson-orin-nx-16gb", "nvidia/jetson-agx-orin-64gb",
            "nvidia/jetson-nano-4gb"} <= jetsons


def test_maxwell_nano_offers_no_int8_and_orin_does():
    assert "int8" not in load_board("nvidia/jetson-nano-4gb").precisions
    assert "int8" in load_board("jetson-orin-nano-8gb").precisions


def test_orin_int8_is_twice_fp16_dense():
    # Ampere tensor cores: dense INT8 = 2x dense FP16 in every power mode (datasheet sparse / 2)
    for name in ("nvidia/jetson-orin-nano-8gb", "nvidia/jetson-orin-nx-16gb", "nvidia/jetson-agx-orin-64gb"):
        for mode in load_board(name).power_modes.values():
            assert mode.peak_tops["int8"] == pytest.approx(2 * mode.peak_tops["fp16"], rel=0.02)


def test_set_overrides_a_field_and_a_nested_field():
    b = load_board("jetson-orin-nano-8gb", ["ram_mb=4096", "budgets.latency_ms=5"])
    assert b.ram_mb == 4096 and b.budgets.latency_ms == 5


@pytest.mark.parametrize(
    "override, needle",
    [
        (["ram_mb=-1"], "ram_mb"),
        (["budgets.power_w=500"], "exceeds the top power mode"),
        (["no_such_field=1"], "no_such_field"),
        (["default_power_mode=\"99W\""], "default_power_mode"),
        (["budgets.nope.x=1"], "no table"),
        (["ram_mb"], "key=value"),
    ],
)
def test_bad_overrides_are_clear_errors(override, needle):
    with pytest.raises(ProfileError, match=needle):
        load_board("jetson-orin-nano-8gb", override)


def test_unknown_board_lists_valid_names():
    with pytest.raises(ProfileError, match="known boards: .*nvidia/jetson-orin-nano-8gb"):
        load_board("jetson-tx9")


def test_unknown_target_lists_valid_names():
    with pytest.raises(ProfileError, match="known targets: .*jetson"):
        load_target("toaster")


def test_override_values_parse_as_toml():
    assert parse_overrides(["a=1", "b=1.5", "c=[1,2]", "d=word"]) == {"a": 1, "b": 1.5, "c": [1, 2], "d": "word"}


def test_targets_list_loads():
    assert any(t.name == "jetson" for t in list_targets())


def test_a_budget_below_every_power_mode_is_refused():
    with pytest.raises(ProfileError, match="below every power mode"):
        load_board("jetson-orin-nano-8gb", ["budgets.power_w=3"])


def test_targets_are_cross_checked_against_the_converter_registry(tmp_path):
    """A target naming a converter that does not exist, or a precision its converter lacks, does not load."""
    from edgekit.errors import ProfileError
    from edgekit.profiles import check_against_registry, load_target

    good = load_target("jetson")
    check_against_registry(good, "jetson.toml")  # every shipped target passes (load_target runs it too)
    for change, needle in [({"converter": "nope"}, "converter 'nope' is not registered"),
                           ({"precisions": ["fp32", "int4"], "tolerances": {**good.tolerances, "int4": good.tolerances["int8"]}},
                            "has no precision int4"),
                           ({"extra": "ios"}, "installed by edgekit\\[jetson\\]")]:
        bad = good.model_copy(update=change)
        with pytest.raises(ProfileError, match=needle):
            check_against_registry(bad, "jetson.toml")


def test_options_are_validated_by_the_converters_model():
    from edgekit.converters import check_options
    from edgekit.errors import ConversionError

    assert check_options("tensorrt", {"keep_float_nodes": "conv1, conv2"}) == {"keep_float_nodes": ["conv1", "conv2"]}
    assert check_options("tflite", {"io": "FLOAT", "threads": 4}) == {"io": "float", "threads": 4}
    assert check_options("tflite", {"keep_float_nodes": "a, b"}) == {"keep_float_nodes": ["a", "b"]}
    with pytest.raises(ConversionError, match="fpga_scales: not an option of converter 'tflite'.*io \\(int8 or float\\)"):
        check_options("tflite", {"fpga_scales": "po2"})  # an FPGA-only option is refused, never dropped
    with pytest.raises(ConversionError, match="calibration"):
        check_options("tflite", {"calibration": "entropy"})  # a jetson-only calibration method is refused on android
    with pytest.raises(ConversionError, match="threads=0"):
        check_options("tflite", {"threads": 0})
