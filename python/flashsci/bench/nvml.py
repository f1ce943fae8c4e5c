"""The GPU's energy counter and SM clock through NVML (ctypes, libnvidia-ml; no Python package needed), for the
experiments that ask whether a run is power-bound: Nvml().energy_mj(), .sm_mhz(), and ClockSampler, which samples the
SM clock from a thread while a block of work runs."""
import ctypes
import statistics
import threading
import time


class Nvml:
    """The NVML calls needed here: total energy (mJ) and current SM clock (MHz) of GPU 0."""

    def __init__(self):
        self.lib = ctypes.CDLL("libnvidia-ml.so.1")
        self.dev = ctypes.c_void_p()
        if self.lib.nvmlInit_v2() or self.lib.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(self.dev)):
            raise RuntimeError("NVML init failed")

    def energy_mj(self):
        e = ctypes.c_ulonglong()
        if self.lib.nvmlDeviceGetTotalEnergyConsumption(self.dev, ctypes.byref(e)):
            raise RuntimeError("nvmlDeviceGetTotalEnergyConsumption failed")
        return e.value

    def sm_mhz(self):
        c = ctypes.c_uint()
        self.lib.nvmlDeviceGetClockInfo(self.dev, 1, ctypes.byref(c))  # NVML_CLOCK_SM
        return c.value


class ClockSampler:
    """with ClockSampler(nvml) as s: ... -> s.mean_mhz (the SM clock every period seconds) and s.joules (the energy
    counter's difference) over the block. NVML's figures lag by a few ms: read them over blocks of 0.1 s or more."""

    def __init__(self, nvml, period=0.005):
        self.nvml, self.period, self.clocks = nvml, period, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run)

    def _run(self):
        while not self._stop.is_set():
            self.clocks.append(self.nvml.sm_mhz())
            time.sleep(self.period)

    def __enter__(self):
        self._e0 = self.nvml.energy_mj()
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.joules = (self.nvml.energy_mj() - self._e0) * 1e-3
        self.mean_mhz = statistics.mean(self.clocks) if self.clocks else 0.0
        return False
