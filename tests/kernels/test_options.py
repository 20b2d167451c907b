"""KernelOptions: parsing and validation, and what the API launches with them, on the CPU.

The launch tests run the public API (forward + autograd backward) on CPU tensors with every kernel
factory replaced by a recorder: each compile (role, factory arguments) and each launch (role, the
arguments' shapes / dtypes / scalar values) is captured. With the default options the API must
launch exactly what it launched before options existed (the env-switch path, options=None at the
low level), and an explicit option must launch what the matching QLABENCH_* switch launches.
"""

from __future__ import annotations

import pytest
import torch

import qlabench.kernels as api
from qlabench.kernels import KernelOptions
from qlabench.kernels.options import CHOICES, ENV_VARS, RETIRED, option_value, parse_options

ENV = (*ENV_VARS.values(), *(r.env for r in RETIRED.values()))


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for var in ENV:
        monkeypatch.delenv(var, raising=False)


# --- parsing and validation --------------------------------------------------------------------------


def test_defaults_are_the_default_kernels():
    o = KernelOptions()
    assert o.as_dict() == {"cp": "auto", "fwd_kernel": "auto", "bwd_dh": "auto", "bwd_cp": "auto",
                           "bwd_masks": "forward"}
    assert o.changed() == {} and o.label() == ""
    assert KernelOptions.from_env({}) == o
    assert KernelOptions.from_dict(None) == o and KernelOptions.from_dict({}) == o


def test_parse_options():
    o = parse_options("cp=on+bwd_dh=ws")
    assert (o.cp, o.bwd_dh, o.fwd_kernel) == ("on", "ws", "auto")
    assert o.label() == "cp=on+bwd_dh=ws"
    assert parse_options("bwd_dh=ws+cp=on").label() == "cp=on+bwd_dh=ws"  # field order
    assert parse_options(" fwd_kernel = wy ").fwd_kernel == "wy"
    assert parse_options("cp=auto").label() == ""  # a default value is no variant
    assert KernelOptions.from_dict(o.as_dict()) == o


@pytest.mark.parametrize("spec, match", [
    ("cp=maybe", r"cp must be one of auto, on, off, got 'maybe'"),
    ("speed=fast", r"unknown kernel option 'speed'; known: cp, fwd_kernel, bwd_dh, bwd_cp, bwd_masks$"),
    ("cp", r"kernel option 'cp' needs key=value"),
    ("cp=on+", r"empty kernel option"),
    ("cp=on+cp=auto", r"kernel option 'cp' given twice"),
    ("fwd_kernel=tma", r"fwd_kernel must be one of auto, pipelined, simple, ws, wy, got 'tma'"),
])
def test_parse_errors_name_the_key_and_value(spec, match):
    with pytest.raises(ValueError, match=match):
        parse_options(spec)


def test_constructor_and_dict_validate():
    with pytest.raises(ValueError, match=r"bwd_dh must be one of auto, ws, pipelined, fused, got 'fast'"):
        KernelOptions(bwd_dh="fast")
    with pytest.raises(ValueError, match=r"unknown kernel option 'split'"):
        KernelOptions.from_dict({"split": "2"})


RETIRED_KKT = r"kernel option kkt \(QLABENCH_KKT\) was removed in session 8: kkt_solve_grouped \(kkt=grouped\) was slower"


@pytest.mark.parametrize("request_", [
    lambda: KernelOptions(kkt="grouped"),
    lambda: KernelOptions(kkt="default"),
    lambda: KernelOptions().replace(kkt="grouped"),
    lambda: parse_options("cp=on+kkt=grouped"),
    lambda: parse_options("kkt=default"),
    lambda: KernelOptions.from_env({"QLABENCH_KKT": "grouped"}),
    lambda: KernelOptions.from_env({"QLABENCH_KKT": "default", "QLABENCH_CP": "on"}),
    lambda: KernelOptions.from_dict({"kkt": "grouped"}),  # a row of the removed variant is no KernelOptions
], ids=["field", "field-default", "replace", "spec", "spec-default", "switch", "switch-default", "dict"])
def test_a_request_for_a_retired_option_says_why_it_went(request_):
    """kkt (kkt_solve_grouped) was removed: any new request for it raises, naming it, its switch and
    where the figures are."""
    with pytest.raises(ValueError, match=RETIRED_KKT) as e:
        request_()
    assert "results/h200/NOTES.md" in str(e.value)


def test_results_rows_keep_the_retired_option():
    """Old rows' options hold "kkt": "default" (what every run launches): dropped on reading; a row of
    kkt=grouped keeps the name it was stored under, the retired option where it stood."""
    from qlabench.kernels.options import stored_label

    old = {"cp": "on", "fwd_kernel": "auto", "kkt": "default", "bwd_dh": "auto", "bwd_cp": "auto"}
    assert KernelOptions.from_dict(old) == KernelOptions(cp="on")
    assert stored_label(old) == "cp=on"
    assert stored_label({**old, "kkt": "grouped", "bwd_dh": "ws"}) == "cp=on+kkt=grouped+bwd_dh=ws"
    assert stored_label({"kkt": "grouped"}, {"cp": "off"}) == "kkt=grouped"
    with pytest.raises(ValueError, match=r"kkt must be one of default, grouped, got 'shared'"):
        stored_label({"kkt": "shared"})


@pytest.mark.parametrize("field", list(CHOICES))
def test_from_env_names_the_variable(field):
    var = ENV_VARS[field]
    for value in CHOICES[field]:
        assert getattr(KernelOptions.from_env({var: value}), field) == value
    with pytest.raises(ValueError, match=rf"{var} must be one of .*got 'bogus'"):
        KernelOptions.from_env({var: "bogus"})


def test_roles_take_explicit_choices(monkeypatch):
    from qlabench.kernels import backward, forward

    monkeypatch.setenv("QLABENCH_FWD_KERNEL", "bogus")  # an explicit choice never reads the switch
    monkeypatch.setenv("QLABENCH_BWD_DH", "bogus")
    assert forward.recurrence_role(1, 132, "sm90", "auto") == "chunk_fwd_ws"
    assert forward.recurrence_role(1, 132, "sm90", "auto", bv=32) == "chunk_fwd_ws"
    assert forward.recurrence_role(1, 132, "sm90", "auto", bv=64) == "chunk_fwd_wy"  # the WY form at BV 64
    assert forward.recurrence_role(1, 132, "sm90", "ws", bv=64) == "chunk_fwd_ws"
    assert forward.recurrence_role(1, 132, "sm100", "auto", bv=64) == "chunk_fwd_pipelined"
    assert forward.recurrence_role(1, 132, "sm100", "auto") == "chunk_fwd_pipelined"
    assert forward.recurrence_role(1, 132, "sm90", "simple") == "chunk_fwd"
    assert backward._dh_role("sm90", "ws") == "bwd_dh_ws"
    assert backward._dh_role("sm90", "auto") == "bwd_dh_ws"  # sm90's default reverse pass
    assert backward._dh_role("sm90", "pipelined") == backward._dh_role("sm100", "auto") == "bwd_dh"
    for call in (lambda: forward.recurrence_role(1, 132, "sm90", "x"), lambda: backward._dh_role("sm90", "x")):
        with pytest.raises(ValueError, match="'x'"):
            call()
    with pytest.raises(ValueError, match="'bogus'"):  # without a choice the switch is read, as before
        forward.recurrence_role(1, 132, "sm90")


# --- launches --------------------------------------------------------------------------------------


def _describe(x):
    if isinstance(x, torch.Tensor):
        return ("tensor", tuple(x.shape), str(x.dtype))
    return x


@pytest.fixture
def launches(monkeypatch):
    """Records every compile and launch of the API on an sm90 'device' (CPU tensors)."""
    from qlabench.kernels import backward, dispatch, forward, forward_cp

    log = []
    sm90 = dispatch.arch_by_name("sm90")
    for mod in (dispatch, forward, backward, forward_cp):
        monkeypatch.setattr(mod, "arch_for_device", lambda device: sm90)
    monkeypatch.setattr(forward, "_sm_count", lambda device: 132)
    monkeypatch.setattr(forward_cp, "_sm_count", lambda device: 132)

    def factory(arch, role):
        a = arch if isinstance(arch, str) else arch.name

        def compile_(*args, **kw):
            log.append(("compile", a, role, args, tuple(sorted(kw.items()))))

            def launch(*largs):
                log.append(("launch", role, tuple(_describe(x) for x in largs)))

            return launch

        return compile_

    for mod in (forward, backward, forward_cp):
        monkeypatch.setattr(mod, "kernel_factory", factory)

    def cumsum(g2, table, C, arch_name):
        log.append(("launch", "chunk_local_cumsum", (_describe(g2), C, arch_name)))
        return torch.zeros_like(g2)

    monkeypatch.setattr(forward, "chunk_local_cumsum", cumsum)
    monkeypatch.setattr(forward_cp, "chunk_local_cumsum", cumsum)
    return log


def _inputs(T=256, h_qk=2, h_v=4, seed=0):
    gen = torch.Generator().manual_seed(seed)
    bf = torch.bfloat16
    q = torch.randn(1, T, h_qk, 128, generator=gen).to(bf).requires_grad_()
    k = torch.randn(1, T, h_qk, 128, generator=gen).to(bf).requires_grad_()
    v = torch.randn(1, T, h_v, 128, generator=gen).to(bf).requires_grad_()
    g = (-torch.rand(1, T, h_v, generator=gen)).requires_grad_()
    beta = torch.rand(1, T, h_v, generator=gen).requires_grad_()
    h0 = torch.randn(2, h_v, 128, 128, generator=gen).requires_grad_()
    cu = torch.tensor([0, T // 2, T], dtype=torch.int32)
    return q, k, v, g, beta, h0, cu


def _step(log, **kw):
    """One training step through the public API; returns the recorded compiles and launches."""
    log.clear()
    q, k, v, g, beta, h0, cu = _inputs()
    o, ht = api.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0, output_final_state=True,
                                       cu_seqlens=cu, **kw)
    torch.autograd.grad((o.float().sum() + ht.sum()), (q, k, v, g, beta, h0), allow_unused=True)
    return list(log)


def _roles(log):
    return [entry[1] for entry in log if entry[0] == "launch"]


def _low_level_step(log):
    """The same step through the low-level entry points without options (the env-switch path the API
    took before KernelOptions)."""
    from qlabench.kernels import backward, forward

    log.clear()
    q, k, v, g, beta, h0, cu = (x.detach() if isinstance(x, torch.Tensor) else x for x in _inputs())
    g_cumsum, A, o, _, ht, masks = forward.chunk_gated_delta_rule_fwd(
        q, k, v, g, beta, initial_state=h0, cu_seqlens=cu, output_final_state=True, return_masks=True)
    do = torch.ones_like(o)
    dht = torch.ones_like(ht)
    keep = option_value(None, "bwd_masks") == "forward"  # what the API's forward keeps for its backward
    backward.chunk_gated_delta_rule_bwd(q, k, v, g_cumsum, beta, A, do, dht, initial_state=h0, cu_seqlens=cu,
                                        masks=masks if keep else None)
    return list(log)


def test_default_options_launch_what_the_switches_launched(launches):
    default = _step(launches)
    # two sequences over 4 v-heads: the backward runs in two lanes (backward.backward_lanes), each with its bwd_dh_ws
    # queued first, its bwd_h beside it and then its bwd_chunk (streams.Lanes)
    assert _roles(default) == ["chunk_local_cumsum", "kkt_solve", "chunk_fwd_ws", "bwd_prepare",
                               *(["bwd_dh_ws", "bwd_h", "bwd_chunk"] * 2)]
    assert _step(launches, options=KernelOptions()) == default
    assert _low_level_step(launches) == default


@pytest.mark.parametrize("field, value, env_value", [
    ("fwd_kernel", "pipelined", "pipelined"),
    ("fwd_kernel", "simple", "simple"),
    ("bwd_dh", "pipelined", "pipelined"),
    ("bwd_masks", "recompute", "recompute"),
])
def test_an_option_launches_what_its_switch_launches(launches, monkeypatch, field, value, env_value):
    by_option = _step(launches, options=KernelOptions().replace(**{field: value}))
    assert by_option != _step(launches)
    monkeypatch.setenv(ENV_VARS[field], env_value)
    assert _step(launches) == by_option  # the API reads the switch once into the same options
    assert _low_level_step(launches) == by_option
    monkeypatch.setenv(ENV_VARS[field], "bogus")  # explicit options: the switches are not read
    assert _step(launches, options=KernelOptions().replace(**{field: value})) == by_option
    compiled = {entry[2] for entry in by_option if entry[0] == "compile"}
    assert {"fwd_kernel": {"pipelined": "chunk_fwd_pipelined", "simple": "chunk_fwd"},
            "bwd_dh": {"pipelined": "bwd_dh"}, "bwd_masks": {"recompute": "bwd_prepare"}}[field][value] in compiled
    if field == "bwd_masks":  # the full bwd_prepare (no variant argument) instead of the factors-only one
        monkeypatch.delenv(ENV_VARS[field])
        prepare = [entry[3] for entry in by_option if entry[:3] == ("compile", "sm90", "bwd_prepare")]
        default = [entry[3] for entry in _step(launches) if entry[:3] == ("compile", "sm90", "bwd_prepare")]
        assert prepare and len(prepare[0]) == 6 and default and default[0][-1] == "none", (prepare, default)


def test_cp_option_routes_forward_and_backward(monkeypatch):
    """options.cp reaches the CP plan (the kernels stubbed as in test_api_cp) and the options reach
    both directions' low-level calls."""
    from qlabench.kernels import backward, backward_cp, dispatch, forward, forward_cp

    seen = []
    monkeypatch.setattr(forward, "chunk_gated_delta_rule_fwd", lambda *a, **kw: seen.append(("fwd", kw)) or (None,) * 6)
    monkeypatch.setattr(forward_cp, "chunk_gated_delta_rule_fwd_cp",
                        lambda *a, **kw: seen.append(("fwd_cp", kw)) or (None,) * 8)
    monkeypatch.setattr(forward, "_sm_count", lambda device: 132)
    monkeypatch.setattr(dispatch, "arch_for_device", lambda device: dispatch.arch_by_name("sm90"))
    x = torch.zeros(1, 32768, 32, 128)  # 32 chains: cp=auto runs the plain forward
    kw = {"scale": 1.0, "initial_state": None, "cu_seqlens": None, "output_final_state": True,
          "output_h": False, "state_v_first": False}
    on = KernelOptions(cp="on", bwd_dh="ws")
    assert api._forward(x, x, x, x[..., 0], x[..., 0], **kw, options=on)[0] is None
    assert api._forward(x, x, x, x[..., 0], x[..., 0], **kw, options=KernelOptions())[5] is None
    monkeypatch.setenv("QLABENCH_CP", "on")  # explicit options win over the switch
    api._forward(x, x, x, x[..., 0], x[..., 0], **kw, options=KernelOptions())
    assert [name for name, _ in seen] == ["fwd_cp", "fwd", "fwd"]
    assert seen[0][1]["options"] is on and seen[1][1]["options"] == KernelOptions()

    grads = tuple(torch.zeros(1) for _ in range(6))
    got = []
    monkeypatch.setattr(backward, "chunk_gated_delta_rule_bwd", lambda *a, **kw: got.append(kw) or grads)
    monkeypatch.setattr(backward_cp, "chunk_gated_delta_rule_bwd_cp", lambda *a, **kw: got.append(kw) or grads)
    monkeypatch.setattr(api, "bwd_cp_plan", lambda q, v, cu, options: got.append({"planned": options}) and None)

    class Ctx:
        saved_tensors = (None,) * 4 + (torch.zeros(1), None, None, None, None, None)  # + Ag, Pm
        scale, state_v_first, g_dtype, cp, options = 1.0, False, torch.float32, None, on

    out = api.ChunkGatedDeltaRuleFunction.backward(Ctx(), torch.zeros(1), None)
    assert len(out) == 12 and out[-1] is None  # one gradient slot per forward input, options and records included
    assert got[0]["planned"] is on and got[1]["options"] is on


def test_public_api_rejects_other_option_types():
    q, k, v, g, beta, _, cu = _inputs()
    with pytest.raises(TypeError, match="KernelOptions"):
        api.chunk_gated_delta_rule(q, k, v, g, beta, cu_seqlens=cu, options={"cp": "on"})
