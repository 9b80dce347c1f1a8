"""A cost measured as the engine runs, kept current and robust to an outlier.

    Smoothed.add(sample); .value          one quantity: the median of its last three samples,
                                          followed by an EWMA (None before any sample)
    Smoothed.steady                       three samples at least: no single one decides
    CostFit(origin=True, steady=False)    a cost fit online (origin: how a failed fit falls back;
                                          steady: only classes of WINDOW samples set the line)
    CostFit.add(units, seconds)           one sample: a step of the engine, a tier's load
    CostFit.line() -> Line | None         seconds ~ fixed + per_unit * units (None: no sample)
    CostFit.predict(units) -> float|None  the line at ``units``
    CostFit.largest() -> float | None     seconds per unit of the largest samples

A sample enters its size class (its units by powers of two: 1, 2-3, 4-7, ...). Each class keeps
the seconds per unit of its recent samples and the units they had (``Smoothed``); the line is fit
through the classes' points, each weighing as many samples as it has seen, up to WEIGHT_CAP. So
steps of one size (a long decode) never wash out what steps of another size (a prefill) taught,
and each class follows its own recent samples.

Where no line fits (one class alone, or a negative slope or intercept: noise), the fallback
leans the way a wrong estimate costs least. A step's fit (``origin=True``) falls back to a line
through the origin: computing is never credited with less than its largest steps show. A load's
(``origin=False``) falls back, on a negative slope or one class, to the cheapest class's
seconds, flat: a short load's fixed cost (a tail of a few tokens in 0.3 ms) never becomes a
per-token rate that would charge a long load a hundred times what it costs; a longer load than
any measured is then predicted optimistically, loaded, and measured.

With ``steady`` (a load's fit: few samples, each a whole job), a class enters the line only once
it is steady, its value a median of WINDOW samples; until two classes are, the fit falls back
(flat: the cheapest class's seconds, optimistic until measured). Three tails of 1, 3 and 25
tokens are three classes of one sample each: one of them slowed by a busy machine (3 ms) would
otherwise draw a line of 120 us a token through them and decline every longer hit.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from typing import NamedTuple

ALPHA = 0.3  # the EWMA's weight of a new (median-filtered) sample
WINDOW = 3  # samples a median is taken over: one outlier among them never enters the EWMA
JUMP = 2.0  # the last WINDOW samples all this far off the value: a lasting change, taken at once
WEIGHT_CAP = 4  # samples a size class weighs at most in the line's fit


class Smoothed:
    """One measured quantity. While it has at most WINDOW samples, its value is their median;
    after that, an EWMA fed with the median of the last WINDOW samples: a single outlier (a page
    fault, a pause, another process on the core) never moves it, a lasting change does after two
    samples, and at once when the last WINDOW samples are all more than JUMP times off it."""

    __slots__ = ("count", "value", "_recent")

    def __init__(self) -> None:
        self.value: float | None = None
        self.count = 0
        self._recent: deque[float] = deque(maxlen=WINDOW)

    @property
    def steady(self) -> bool:
        """Whether its value is a median of WINDOW samples at least: no single outlier."""
        return self.count >= WINDOW

    def add(self, sample: float) -> None:
        self._recent.append(sample)
        self.count += 1
        middle = statistics.median(self._recent)
        value = self.value
        if value is None or self.count <= WINDOW or _all_off(self._recent, value):
            self.value = middle
        else:
            self.value = value + ALPHA * (middle - value)


def _all_off(samples: deque[float], value: float) -> bool:
    return all(s > JUMP * value for s in samples) or all(s * JUMP < value for s in samples)


class Line(NamedTuple):
    """seconds ~ fixed + per_unit * units."""

    fixed: float
    per_unit: float

    def at(self, units: float) -> float:
        return self.fixed + self.per_unit * units


class _SizeClass:
    __slots__ = ("per_unit", "units")

    def __init__(self) -> None:
        self.units = Smoothed()
        self.per_unit = Smoothed()


class CostFit:
    """seconds ~ fixed + per_unit * units, fit online from samples of any size."""

    def __init__(self, origin: bool = True, steady: bool = False) -> None:
        """``origin``: where no line fits, one through the origin (True) or flat (False);
        ``steady``: only steady classes set the line (see the module's docstring)."""
        self.origin, self.steady = origin, steady
        self._classes: dict[int, _SizeClass] = {}
        self._line: Line | None = None
        self.samples = 0

    def add(self, units: float, seconds: float) -> None:
        """One sample; ignored unless ``units`` > 0 and ``seconds`` >= 0, both finite."""
        if not (units > 0 and seconds >= 0 and math.isfinite(units) and math.isfinite(seconds)):
            return
        size = self._classes.setdefault(int(units).bit_length(), _SizeClass())
        size.units.add(units)
        size.per_unit.add(seconds / units)
        self.samples += 1
        self._line = None

    def predict(self, units: float) -> float | None:
        line = self.line()
        return None if line is None else line.at(units)

    def largest(self) -> float | None:
        """Seconds per unit of the largest size class (None: no sample)."""
        if not self._classes:
            return None
        return self._classes[max(self._classes)].per_unit.value

    def line(self) -> Line | None:
        """The weighted least-squares line through the size classes; where none fits, the
        fallback ``origin`` chose (see the module's docstring)."""
        if self._line is None and self._classes:
            points = [
                (size.units.value or 0.0, size.per_unit.value or 0.0,
                 min(size.per_unit.count, WEIGHT_CAP))
                for size in self._classes.values()
            ]  # fmt: skip
            fitted = [
                point
                for point, size in zip(points, self._classes.values())
                if size.per_unit.steady or not self.steady
            ]
            line = _fit(fitted) if len(fitted) >= 2 else None
            self._line = line if line is not None else _fallback(points, self.origin)
        return self._line


def _fit(points: list[tuple[float, float, int]]) -> Line | None:
    """The line through ``(units, seconds per unit, weight)`` points: one with a positive slope
    and no negative fixed part (a negative one: through the origin); None: no such line."""
    xs = [x for x, _, _ in points]
    ys = [x * per_unit for x, per_unit, _ in points]
    ws = [float(w) for _, _, w in points]
    total = sum(ws)
    mean_x = sum(w * x for w, x in zip(ws, xs)) / total
    mean_y = sum(w * y for w, y in zip(ws, ys)) / total
    sxx = sum(w * (x - mean_x) ** 2 for w, x in zip(ws, xs))
    if sxx <= 0:
        return None
    slope = sum(w * (x - mean_x) * (y - mean_y) for w, x, y in zip(ws, xs, ys)) / sxx
    fixed = mean_y - slope * mean_x
    if slope <= 0:
        return None
    return Line(fixed, slope) if fixed >= 0 else _fallback(points, origin=True)


def _fallback(points: list[tuple[float, float, int]], origin: bool) -> Line:
    """Where no line fits: through the origin (``origin``), else flat at the cheapest
    point's seconds."""
    if not origin:
        return Line(min(x * per_unit for x, per_unit, _ in points), 0.0)
    through_origin = sum(w * x * x * per_unit for x, per_unit, w in points) / sum(
        w * x * x for x, _, w in points
    )
    return Line(0.0, through_origin)
