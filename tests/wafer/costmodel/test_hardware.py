"""Hardware specs and calibration parameters: the published numbers and their internal consistency."""

import math

import pytest

from wafer.costmodel import CALIBRATION, SYSTEMS, Calibration, get_system


def test_grids_and_memory_match_the_published_specs():
  wse2 = get_system("wse2").chip
  assert (wse2.fabric_width, wse2.fabric_height) == (757, 996)  # SDK fabric dims, most CS-2s
  assert (get_system("wse3").chip.fabric_width, get_system("wse3").chip.fabric_height) == (762, 1176)
  assert (get_system("wse1").chip.fabric_width, get_system("wse1").chip.fabric_height) == (633, 633)
  for sys_ in SYSTEMS.values():
    chip = sys_.chip
    assert chip.sram_bytes_per_pe == 48 * 1024
    assert 0 < chip.usable_pes < chip.fabric_pes
    assert chip.usable_pes > 0.98 * chip.fabric_pes  # the I/O margin is a few edge columns
    assert chip.router_ports == 5
    assert chip.link_bytes_per_cycle == 4  # one 32-bit wavelet per cycle per direction


def test_total_sram_matches_the_marketed_capacity():
  # 40 GB (WSE-2) and 44 GB (WSE-3) marketed; the SDK grid x 48 KB must be close (within 10 %)
  for key, marketed in (("wse2", 40e9), ("wse3", 44e9)):
    chip = get_system(key).chip
    assert abs(chip.fabric_pes * chip.sram_bytes_per_pe / marketed - 1) < 0.1


def test_dense_peak_is_in_the_derived_range():
  # docs/references.md, "Hardware": dense FP16 peak 5.1-6.6 PF (WSE-2 SDK grid) and 12.2-15.8 PF (WSE-3) at 0.85-1.1 GHz
  for key, (lo, hi) in (("wse2", (5.0e15, 6.7e15)), ("wse3", (12.0e15, 15.9e15))):
    chip = get_system(key).chip
    for clock in (0.85e9, 1.1e9):
      peak = chip.fabric_pes * chip.peak_flops_per_cycle(16) * clock
      assert lo <= peak <= hi, (key, clock, peak)
  assert get_system("wse2").chip.peak_flops_per_cycle(32) < get_system("wse2").chip.peak_flops_per_cycle(16)


def test_wse2_sram_ports_match_the_published_memory_bandwidth():
  # docs/references.md, "Hardware": 20 PB/s on WSE-2's 850k cores. At the published clock range
  # (0.85-1.1 GHz) that is 21-28 bytes per PE per cycle: the HC34 ports (2 x 64-bit read + 1 x 64-bit
  # write = 24 B) fit.
  chip = get_system("wse2").chip
  per_cycle = chip.sram_read_bytes_per_cycle + chip.sram_write_bytes_per_cycle
  assert 20e15 / 850e3 / 1.1e9 <= per_cycle <= 20e15 / 850e3 / 0.85e9


def test_wse3_matmul_datapath_is_twice_the_wse2s_per_pe():
  """Cerebras' WSE-3 announcement: twice the WSE-2's performance at the same power, 8-wide FP16
  SIMD; 125 PF over 900k cores against 75 PF over 850k is 1.57x per core, at most 2x. A 16-bit AXPY
  into FP32 accumulators (the inner loop of every weight product) runs twice as fast per PE and
  cycle on the WSE-3, and no faster than its SIMD."""
  from wafer.costmodel.mesh import Machine

  rates = {}
  for key in ("wse2", "wse3"):
    pe = Machine(get_system(key).chip, CALIBRATION).pe(16)
    length = 4096
    rates[key] = length / (pe.axpy(length) - (0 if pe.overlap else pe.c_op))
    assert rates[key] <= pe.lanes
  assert rates["wse3"] / rates["wse2"] == pytest.approx(2.0, rel=0.01)
  assert 125 / 900 / (75 / 850) <= rates["wse3"] / rates["wse2"] <= 2.0 + 1e-9


def test_io_bandwidth():
  assert get_system("cs2").io_bytes_per_sec == pytest.approx(150e9)  # 12 x 100 GbE
  assert get_system("wse3").io_bytes_per_sec > get_system("wse2").io_bytes_per_sec  # ~30 % more on CS-3


def test_system_names_and_errors():
  assert get_system("CS-2") is get_system("wse2") is get_system("WSE-2")
  with pytest.raises(ValueError, match=r"system='tpu'.*'wse1', 'wse2', 'wse3'"):
    get_system("tpu")


def test_calibration_is_physical_and_validated():
  assert 0.85e9 <= CALIBRATION.clock_hz <= 1.1e9  # the published range of the clock
  assert 1 <= CALIBRATION.instruction_overhead_cycles <= 50
  assert CALIBRATION.sram_reserved_bytes_per_pe < 48 * 1024
  assert CALIBRATION.replace(clock_hz=1.1e9).clock_hz == 1.1e9
  with pytest.raises(
    ValueError, match=r"no parameter 'score_cycles'; allowed: clock_hz, .*attention_row_cycles"
  ):
    CALIBRATION.replace(score_cycles=724.0)
  assert "clock_hz" in str(CALIBRATION.describe())
  with pytest.raises(ValueError, match="clock_hz"):
    Calibration(clock_hz=0.0)
  with pytest.raises(ValueError, match="instruction_overhead_cycles"):
    Calibration(instruction_overhead_cycles=-1.0)
  assert math.isfinite(sum(CALIBRATION.to_dict().values()))
