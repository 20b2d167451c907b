"""One small float64 test case description shared by the reference and backward-emulation tests."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Case:
    B: int = 1
    T: int = 64
    h_qk: int = 2
    h_v: int = 2
    K: int = 16
    V: int = 16
    C: int = 16
    cu_seqlens: tuple[int, ...] | None = None
    h0: bool = False
    dht: bool = True
    state_v_first: bool = False
    strong_decay: bool = False
    l2norm: bool = False
    seed: int = 0

    @property
    def id(self) -> str:
        """Readable pytest id, e.g. `B1-T200-H2-HV4-K16-V16-C16-varlen0_37_100_163-h0`."""
        parts = [f"B{self.B}", f"T{self.T}", f"H{self.h_qk}", f"HV{self.h_v}", f"K{self.K}", f"V{self.V}",
                 f"C{self.C}"]
        if self.cu_seqlens is not None:
            parts.append("varlen" + "_".join(map(str, self.cu_seqlens)))
        for flag, name in ((self.h0, "h0"), (not self.dht, "nodht"), (self.state_v_first, "vfirst"),
                           (self.strong_decay, "strongdecay"), (self.l2norm, "l2norm")):
            if flag:
                parts.append(name)
        return "-".join(parts)

    @property
    def N(self) -> int:
        return self.B if self.cu_seqlens is None else len(self.cu_seqlens) - 1
