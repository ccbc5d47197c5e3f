"""bench/sass_waves.py: global-load waves counted from SASS text (no GPU, no nvdisasm)."""

from bench.sass_waves import load_waves


def _sass(*lines):
    return "\n".join(f"        /*{16 * i:04x}*/    {line} ;" for i, line in enumerate(lines))


def test_loads_issued_together_are_one_wave():
    sass = _sass("LDG.E R4, desc[UR4][R2.64]", "@!P0 LDG.E.64 R6, desc[UR4][R8.64]", "FADD R10, R4, R7",
                 "STG.E desc[UR4][R2.64], R10", "EXIT")
    assert load_waves(sass) == dict(ldg=2, waves=1, waves_after_wait=None, bar=0)


def test_a_load_issued_after_a_use_of_an_earlier_one_is_a_new_wave():
    # R5 is the upper half of the first LDG.E.64: reading it waits for that load
    sass = _sass("LDG.E.64 R4, desc[UR4][R2.64]", "SHFL.BFLY PT, R9, R5, 0x10, 0x1f", "LDG.E R12, desc[UR4][R2.64]",
                 "FMNMX R13, R12, R9, !PT", "LDG.E R14, desc[UR4][R2.64]", "EXIT")
    assert load_waves(sass)["waves"] == 3


def test_overwritten_register_is_no_longer_pending_and_the_address_is_read():
    sass = _sass("LDG.E R4, desc[UR4][R2.64]", "MOV R4, RZ", "IADD3 R6, R4, 0x1, RZ",   # R4 rewritten: no wait
                 "LDG.E R8, desc[UR4][R6.64]", "BAR.SYNC.DEFER_BLOCKING 0x0",
                 "LDG.E R10, desc[UR4][R8.64]")                                          # address from a load
    assert load_waves(sass) == dict(ldg=3, waves=2, waves_after_wait=None, bar=1)


def test_waves_after_the_dependent_launch_wait():
    sass = _sass("LDG.E R4, desc[UR4][R2.64]", "ACQBULK", "LDG.E R6, desc[UR4][R2.64]", "FADD R7, R6, R4",
                 "LDG.E R8, desc[UR4][R2.64]", "EXIT")
    assert load_waves(sass) == dict(ldg=3, waves=3, waves_after_wait=2, bar=0)


def test_a_shuffle_writes_the_register_after_its_predicate_output():
    # SHFL.BFLY PT, R4, R7: R4 is written (not read), so the load into R4 is not waited for and the
    # next load joins its wave (reading R4 as a source counted 2 waves; an earlier version of this
    # test had a second shuffle that made 2 waves either way)
    sass = _sass("LDG.E R4, desc[UR4][R2.64]", "SHFL.BFLY PT, R4, R7, 0x10, 0x1f", "LDG.E R12, desc[UR4][R2.64]",
                 "EXIT")
    assert load_waves(sass) == dict(ldg=2, waves=1, waves_after_wait=None, bar=0)
    # a shuffle that reads a loaded register (R9) does wait for it
    sass = _sass("LDG.E R9, desc[UR4][R2.64]", "SHFL.BFLY PT, R13, R9, 0x8, 0x1f", "LDG.E R14, desc[UR4][R2.64]",
                 "EXIT")
    assert load_waves(sass)["waves"] == 2
