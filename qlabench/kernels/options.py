"""KernelOptions: every kernel choice of the API as one explicit, typed value.

The A/B variants of the kernels (intra-card CP, the forward recurrence, the per-chunk solve, the
backward's reverse pass) are fields here. The public API (`chunk_gated_delta_rule`) reads the
environment at most once per call (`KernelOptions.from_env`, the ``QLABENCH_*`` switches below) when
no ``options`` are passed, and hands the same value down to the forward and its backward; the
low-level entry points (`forward.chunk_gated_delta_rule_fwd`, `backward.chunk_gated_delta_rule_bwd`,
`forward_cp` / `backward_cp`) take ``options`` too, and read the switches themselves only when called
without them (direct callers such as the GPU tests and tools/*_variants.py).

The defaults are the kernels the API launches without any switch. `QLABENCH_WS_AUTO_SYNC` is not an
option: it is read by the warp-specialized kernel factories while compiling (a race-debugging
switch), outside the host plumbing.

Leaf module (no torch import of its own).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

# field -> (choices, default, environment switch). Choice order is the order error messages list.
CHOICES: dict[str, tuple[str, ...]] = {
    "cp": ("auto", "on", "off"),
    "fwd_kernel": ("auto", "pipelined", "simple", "ws", "wy"),
    "kkt": ("default", "grouped"),
    "bwd_dh": ("auto", "ws", "pipelined"),
    "bwd_cp": ("auto", "on", "off"),
}
ENV_VARS: dict[str, str] = {
    "cp": "QLABENCH_CP",
    "fwd_kernel": "QLABENCH_FWD_KERNEL",
    "kkt": "QLABENCH_KKT",
    "bwd_dh": "QLABENCH_BWD_DH",
    "bwd_cp": "QLABENCH_BWD_CP",
}
MEANING: dict[str, str] = {
    "cp": "intra-card context parallelism of the forward and its backward: auto (api.cp_rule: cp.py's plan "
          "on few chains over long sequences), on (cp.py's pieces wherever a sequence can be cut), off",
    "fwd_kernel": "forward chunk recurrence: auto (sm90: ws at V tile 32, wy at 64; else pipelined), ws, wy, pipelined, simple",
    "kkt": "per-chunk solve: default (kkt_solve), grouped (kkt_solve_grouped: sm90, GQA only)",
    "bwd_dh": "backward reverse pass: auto (ws on sm90, else pipelined), ws (bwd_dh_ws, sm90 only), pipelined",
    "bwd_cp": "CP of the backward when the forward ran without it (piece states recomputed): auto "
              "(api.bwd_cp_plan's rule), on, off",
}


@dataclass(frozen=True)
class KernelOptions:
    """Kernel variants of one call. Defaults = the API's default kernels.

    Attributes:
        cp: ``auto`` | ``on`` | ``off`` (QLABENCH_CP): intra-card CP of the forward and its backward;
            ``auto`` (the default) follows the measured rule of `api.cp_rule`.
        fwd_kernel: ``auto`` | ``ws`` | ``wy`` | ``pipelined`` | ``simple`` (QLABENCH_FWD_KERNEL; ``ws``
            and ``wy`` raise ValueError on archs without them; ``auto``: forward.recurrence_role).
        kkt: ``default`` | ``grouped`` (QLABENCH_KKT; grouped applies on sm90 with GQA, and not in
            the CP forward, which always runs kkt_solve).
        bwd_dh: ``auto`` | ``ws`` | ``pipelined`` (QLABENCH_BWD_DH; ``ws`` is sm90 only).
        bwd_cp: ``auto`` | ``on`` | ``off`` (QLABENCH_BWD_CP): intra-card CP of the backward of a
            forward that ran without CP (with ``cp`` on, the backward always mirrors the forward's
            pieces); the backward then recomputes the piece initial states itself.
    """

    cp: str = "auto"
    fwd_kernel: str = "auto"
    kkt: str = "default"
    bwd_dh: str = "auto"
    bwd_cp: str = "auto"

    def __post_init__(self):
        for f in fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, str) or value not in CHOICES[f.name]:
                raise ValueError(f"kernel option {f.name} must be one of {', '.join(CHOICES[f.name])}, "
                                 f"got {value!r}")

    @classmethod
    def from_env(cls, environ=None) -> KernelOptions:
        """The QLABENCH_* switches (unset: the default); a bad value raises ValueError naming the
        variable and the value (the message dispatch.env_choice gives)."""
        return cls(**{name: option_value(None, name, environ) for name in ENV_VARS})

    @classmethod
    def from_dict(cls, d: dict | None) -> KernelOptions:
        """From a results row's ``options`` (None or missing keys: defaults; an unknown key raises)."""
        d = dict(d or {})
        unknown = sorted(set(d) - set(CHOICES))
        if unknown:
            raise ValueError(f"unknown kernel option {unknown[0]!r}; known: {', '.join(CHOICES)}")
        return cls(**d)

    def replace(self, **changes) -> KernelOptions:
        unknown = sorted(set(changes) - set(CHOICES))
        if unknown:
            raise ValueError(f"unknown kernel option {unknown[0]!r}; known: {', '.join(CHOICES)}")
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

    ValueError naming the bad item, key or value: ``cp`` without ``=``, an unknown key, a value
    outside the key's choices, a key given twice.
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
        if key not in CHOICES:
            raise ValueError(f"unknown kernel option {key!r}; known: {', '.join(CHOICES)}")
        if value not in CHOICES[key]:
            raise ValueError(f"kernel option {key} must be one of {', '.join(CHOICES[key])}, got {value!r}")
        if key in changes:
            raise ValueError(f"kernel option {key!r} given twice in {spec!r}")
        changes[key] = value
    return base.replace(**changes)
