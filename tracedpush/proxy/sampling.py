"""The proxy's trace sampler: OpenTelemetry's own, chosen by the standard variables.

`OTEL_TRACES_SAMPLER` / `OTEL_TRACES_SAMPLER_ARG` are read by the SDK itself: a
`TracerProvider` built without a sampler takes it from the environment. This module only
refuses values the SDK would silently replace (an unknown name or a ratio that is not a
number in [0, 1] fall back to sampling everything, with a log warning: a 100x surprise
for someone who asked for 1%), and names the sampler the SDK built, so the root span can
say how its request was sampled (`semconv.SAMPLER`, `semconv.SAMPLER_RATIO`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from opentelemetry.sdk.trace.sampling import ParentBased, Sampler, TraceIdRatioBased

ENV_SAMPLER = "OTEL_TRACES_SAMPLER"
ENV_SAMPLER_ARG = "OTEL_TRACES_SAMPLER_ARG"
# The specification's built-in samplers, the ones the Python SDK knows.
SAMPLERS = (
    "always_on",
    "always_off",
    "traceidratio",
    "parentbased_always_on",
    "parentbased_always_off",
    "parentbased_traceidratio",
)
RATIO_SAMPLERS = ("traceidratio", "parentbased_traceidratio")


def check_env(environ: Mapping[str, str] | None = None) -> None:
    """Raise ValueError, naming the variable, for a sampler setting the SDK would replace
    by "sample everything". An unset ratio is the specification's default, 1.0."""
    env = os.environ if environ is None else environ
    name = env.get(ENV_SAMPLER, "").strip().lower()
    if name and name not in SAMPLERS:
        raise ValueError(f"{ENV_SAMPLER}={env[ENV_SAMPLER]!r} is not one of {', '.join(SAMPLERS)}")
    arg = env.get(ENV_SAMPLER_ARG, "").strip()
    if name in RATIO_SAMPLERS and arg:
        try:
            ratio = float(arg)
        except ValueError:
            ratio = -1.0
        if not 0.0 <= ratio <= 1.0:  # NaN fails too
            raise ValueError(f"{ENV_SAMPLER_ARG}={arg!r} must be a number in [0, 1] for {name}")


@dataclass(frozen=True, slots=True)
class SamplerInfo:
    """What the proxy's sampler does to a request that arrives without trace context."""

    name: str  # as OTEL_TRACES_SAMPLER names it; the SDK's description for another sampler
    ratio: float | None  # probability such a request is kept (None: not a known sampler)
    parent_based: bool  # a client's traceparent decides instead, when it sent one

    def describe(self) -> str:
        """For the ready line: "parentbased_traceidratio at 1%"."""
        return self.name if self.ratio is None else f"{self.name} at {percent(self.ratio)}"


def describe(sampler: Sampler) -> SamplerInfo:
    """Name `sampler` (the SDK's: `TracerProvider.sampler`)."""
    parent_based = isinstance(sampler, ParentBased)
    # ParentBased keeps its root sampler private; it has done so since the SDK's 1.0
    root = getattr(sampler, "_root", None) if parent_based else sampler
    if isinstance(root, TraceIdRatioBased):
        kind, ratio = "traceidratio", root.rate
    elif root is not None and root.get_description() in ("AlwaysOnSampler", "AlwaysOffSampler"):
        on = root.get_description() == "AlwaysOnSampler"
        kind, ratio = ("always_on", 1.0) if on else ("always_off", 0.0)
    else:
        return SamplerInfo(sampler.get_description(), None, parent_based)
    return SamplerInfo(("parentbased_" if parent_based else "") + kind, ratio, parent_based)


def percent(ratio: float) -> str:
    """0.01 -> "1%", 0.005 -> "0.5%"."""
    return f"{100.0 * ratio:.4g}%"
