"""KernelOptions: every kernel choice of the API as one explicit, typed value.

The A/B variants of the kernels (intra-card CP, the forward recurrence, the backward's reverse pass)
are fields here. The public API (`chunk_gated_delta_rule`) reads the environment at most once per call
(`KernelOptions.from_env`, the ``QLABENCH_*`` switches below) when no ``options`` are passed, and hands
the same value down to the forward and its backward; the low-level entry points
(`forward.chunk_gated_delta_rule_fwd`, `backward.chunk_gated_delta_rule_bwd`, `forward_cp` /
`backward_cp`) take ``options`` too, and read the switches themselves only when called without them
(direct callers such as the GPU tests and tools/*_variants.py).

The defaults are the kernels the API launches without any switch. `QLABENCH_WS_AUTO_SYNC` is not an
option: it is read by the warp-specialized kernel factories while compiling (a race-debugging
switch), outside the host plumbing.

A removed option stays in RETIRED: results files hold it (``"kkt": "default"`` in rows' ``options``
and ``run.option_defaults``), so their readers accept it (KernelOptions.from_dict, stored_label), while
a new request for it (a field, a ``key=value`` spec, its switch) raises ValueError saying why it went.

Leaf module (no torch import of its own).
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, fields

# field -> (choices, default, environment switch). Choice order is the order error messages list.
CHOICES: dict[str, tuple[str, ...]] = {
    "cp": ("auto", "on", "off"),
    "fwd_kernel": ("auto", "pipelined", "simple", "ws", "wy"),
    "bwd_dh": ("auto", "ws", "pipelined", "fused"),
    "bwd_cp": ("auto", "on", "off"),
    "bwd_masks": ("forward", "recompute"),
}
ENV_VARS: dict[str, str] = {
    "cp": "QLABENCH_CP",
    "fwd_kernel": "QLABENCH_FWD_KERNEL",
    "bwd_dh": "QLABENCH_BWD_DH",
    "bwd_cp": "QLABENCH_BWD_CP",
    "bwd_masks": "QLABENCH_BWD_MASKS",
}
MEANING: dict[str, str] = {
    "cp": "intra-card context parallelism of the forward and its backward: auto (api.cp_rule: cp.py's plan "
          "on few chains over long sequences), on (cp.py's pieces wherever a sequence can be cut), off",
    "fwd_kernel": "forward chunk recurrence: auto (sm90: ws at V tile 32, wy at 64; else pipelined), ws, wy, pipelined, simple",
    "bwd_dh": "backward reverse pass: auto (ws on sm90, else pipelined), ws (bwd_dh_ws, sm90 only), pipelined, "
              "fused (the dS chain inside the per-chunk kernel, hopper/bwd_fused.py; sm90, H_v == H_qk; auto takes it on "
              "CP backwards of <= 56 effective chains)",
    "bwd_cp": "CP of the backward when the forward ran without it (piece states recomputed): auto "
              "(api.bwd_cp_plan's rule), on, off",
    "bwd_masks": "the backward's gated masks Ag, Pg: forward (kkt_solve's, kept from the forward for its "
                 "backward: bwd_prepare forms only what is missing; two C-column bf16 tensors more saved "
                 "per call) or recompute (bwd_prepare forms both; nothing more saved)",
}


@dataclass(frozen=True)
class Retired:
    """A removed option as results files still hold it (rows' ``options``, ``run.option_defaults``)."""

    choices: tuple[str, ...]  # its values; the first launched what every run still launches
    after: str  # the field it followed in the names rows were stored under
    env: str  # its former QLABENCH_* switch
    why: str


RETIRED: dict[str, Retired] = {
    "kkt": Retired(("default", "grouped"), "fwd_kernel", "QLABENCH_KKT",
                   "removed in session 8: kkt_solve_grouped (kkt=grouped) was slower than kkt_solve at every "
                   "measured case (results/h200/NOTES.md); the forward always runs kkt_solve"),
}


def retired_error(name: str) -> ValueError:
    """The ValueError for a new request of retired option ``name`` (field, spec or switch)."""
    r = RETIRED[name]
    return ValueError(f"kernel option {name} ({r.env}) was {r.why}; drop it")


def _refuse_retired(keys) -> None:
    """retired_error for the first retired option among ``keys``."""
    for name in RETIRED:
        if name in keys:
            raise retired_error(name)


def _check_keys(keys) -> None:
    """retired_error for a retired option among ``keys``, else ValueError naming the first unknown one."""
    _refuse_retired(keys)
    unknown = sorted(set(keys) - set(CHOICES))
    if unknown:
        raise ValueError(f"unknown kernel option {unknown[0]!r}; known: {', '.join(CHOICES)}")


@dataclass(frozen=True)
class KernelOptions:
    """Kernel variants of one call. Defaults = the API's default kernels.

    Attributes:
        cp: ``auto`` | ``on`` | ``off`` (QLABENCH_CP): intra-card CP of the forward and its backward;
            ``auto`` (the default) follows the measured rule of `api.cp_rule` (wider when the inputs
            require grad).
        fwd_kernel: ``auto`` | ``ws`` | ``wy`` | ``pipelined`` | ``simple`` (QLABENCH_FWD_KERNEL; ``ws``
            and ``wy`` raise ValueError on archs without them; ``auto``: forward.recurrence_role).
        bwd_dh: ``auto`` | ``ws`` | ``pipelined`` (QLABENCH_BWD_DH; ``ws`` is sm90 only).
        bwd_cp: ``auto`` | ``on`` | ``off`` (QLABENCH_BWD_CP): intra-card CP of the backward of a
            forward that ran without CP (with ``cp`` on, the backward always mirrors the forward's
            pieces); the backward then recomputes the piece initial states itself.
        bwd_masks: ``forward`` | ``recompute`` (QLABENCH_BWD_MASKS): whether the forward keeps
            kkt_solve's Ag and Pm (the backward's Ag and Pg) for its backward (saved with the inputs:
            `[B * T, H_v, C]` bf16 each), so the backward's bwd_prepare forms only what is missing, or
            the backward forms both itself.
    """

    cp: str = "auto"
    fwd_kernel: str = "auto"
    bwd_dh: str = "auto"
    bwd_cp: str = "auto"
    bwd_masks: str = "forward"

    def __new__(cls, *args, **kwargs):
        """A retired field raises its ValueError (retired_error) instead of the dataclass's TypeError."""
        _refuse_retired(kwargs)
        return super().__new__(cls)

    def __post_init__(self):
        for f in fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, str) or value not in CHOICES[f.name]:
                raise ValueError(f"kernel option {f.name} must be one of {', '.join(CHOICES[f.name])}, "
                                 f"got {value!r}")

    @classmethod
    def from_env(cls, environ=None) -> KernelOptions:
        """The QLABENCH_* switches (unset: the default); a bad value raises ValueError naming the
        variable and the value (the message dispatch.env_choice gives); a retired switch set raises
        retired_error."""
        env = os.environ if environ is None else environ
        _refuse_retired([name for name, r in RETIRED.items() if r.env in env])
        return cls(**{name: option_value(None, name, environ) for name in ENV_VARS})

    @classmethod
    def from_dict(cls, d: dict | None) -> KernelOptions:
        """From a results row's ``options`` (None or missing keys: defaults; an unknown key raises). A
        retired option at its first value (what every run still launches) is dropped; at another, the
        row measured a removed variant: retired_error."""
        d = {k: v for k, v in (d or {}).items() if not (k in RETIRED and v == RETIRED[k].choices[0])}
        _check_keys(d)
        return cls(**d)

    def replace(self, **changes) -> KernelOptions:
        _check_keys(changes)
        return KernelOptions(**{**asdict(self), **changes})

    def as_dict(self) -> dict[str, str]:
        return asdict(self)

    def changed(self, defaults: dict[str, str] | None = None) -> dict[str, str]:
        """The fields that differ from ``defaults`` (None: today's DEFAULTS), in field order."""
        base = {**DEFAULTS, **(defaults or {})}
        return {k: v for k, v in asdict(self).items() if v != base[k]}

    def label(self, defaults: dict[str, str] | None = None) -> str:
        """``cp=on+bwd_dh=ws`` (fields that differ from ``defaults``, None: today's, in field order);
        ``""`` for the defaults."""
        return "+".join(f"{k}={v}" for k, v in self.changed(defaults).items())


DEFAULTS: dict[str, str] = {f.name: f.default for f in fields(KernelOptions)}


def option_value(options: KernelOptions | None, name: str, environ=None) -> str:
    """Field ``name`` of ``options``, or without options its QLABENCH_* switch read now (unset: the
    default; a bad value: dispatch.env_choice's ValueError naming the variable)."""
    if options is not None:
        return getattr(options, name)
    from .dispatch import env_choice

    return env_choice(ENV_VARS[name], CHOICES[name], DEFAULTS[name], environ)


def parse_options(spec: str, base: KernelOptions | None = None) -> KernelOptions:
    """``"cp=on+bwd_dh=ws"`` -> KernelOptions (``base`` or the defaults, with those fields set).

    ValueError naming the bad item, key or value: ``cp`` without ``=``, an unknown key, a retired one
    (retired_error), a value outside the key's choices, a key given twice.
    """
    base = base or KernelOptions()
    changes: dict[str, str] = {}
    for item in spec.split("+"):
        item = item.strip()
        if not item:
            raise ValueError(f"empty kernel option in {spec!r} (write key=value+key=value)")
        key, eq, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not eq:
            raise ValueError(f"kernel option {item!r} needs key=value (keys: {', '.join(CHOICES)})")
        _check_keys([key])
        if value not in CHOICES[key]:
            raise ValueError(f"kernel option {key} must be one of {', '.join(CHOICES[key])}, got {value!r}")
        if key in changes:
            raise ValueError(f"kernel option {key!r} given twice in {spec!r}")
        changes[key] = value
    return base.replace(**changes)


def stored_label(options: dict, defaults: dict | None = None) -> str:
    """The label a results row's ``options`` were stored under: ``label`` of the fields that differ from
    ``defaults`` (None: today's), a retired option at its first value dropped, at another kept where it
    stood (``kkt=grouped``: the row measured a removed variant). ValueError for an unknown option or
    value."""
    retired = {k: v for k, v in options.items() if k in RETIRED and v != RETIRED[k].choices[0]}
    for k, v in retired.items():
        if v not in RETIRED[k].choices:
            raise ValueError(f"kernel option {k} must be one of {', '.join(RETIRED[k].choices)}, got {v!r}")
    current = {k: v for k, v in options.items() if k not in retired}
    items = {**KernelOptions.from_dict({**(defaults or {}), **current}).changed(defaults), **retired}
    order = list(CHOICES)
    for name, r in RETIRED.items():
        order.insert(order.index(r.after) + 1, name)
    return "+".join(f"{k}={items[k]}" for k in order if k in items)
