"""bench/pytest_rest.py: the ids a cut `pytest -v` run did not report are the ones left."""

import os
import subprocess
import sys

from bench.pytest_rest import remaining, reported_ids

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

XDIST_LOG = """\
bringing up nodes...
[gw0] [  1%] PASSED tests/test_a.py::test_one[x-1]
[gw3] [  2%] SKIPPED tests/test_a.py::test_two
[gw1] [  3%] FAILED tests/test_b.py::test_three[cuda-1.0]
[gw2] [  4%] ERROR tests/test_b.py::test_four
[gw2] [  5%] XFAIL tests/test_b.py::test_five
[gw4] [  6%] PASSED tests/test_c.py::test_doc[Using the ops] 
[gw4] [  7%] SKIPPED tests/test_c.py::test_schema['type' beside 'allOf' at #-schema0]
SKIPPED [6] tests/test_a.py:428: small shapes run under the interpreter
!!!!!!!!!!!!!!!!!!!!!!!!!!!!!! KeyboardInterrupt !!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!
"""

PLAIN_LOG = """\
tests/test_a.py::test_one[x-1] PASSED                                     [ 20%]
tests/test_a.py::test_two SKIPPED (interpreter test)                      [ 40%]
tests/test_b.py::test_three[cuda-1.0] FAILED                              [ 60%]
tests/test_b.py::test_six
tests/test_c.py::test_doc[Using the ops] PASSED                           [ 80%]
tests/test_c.py::test_doc[Using the engine]
"""

COLLECTED = ["tests/test_a.py::test_one[x-1]", "tests/test_a.py::test_one[x-2]", "tests/test_a.py::test_two",
             "tests/test_b.py::test_three[cuda-1.0]", "tests/test_b.py::test_four", "tests/test_b.py::test_five",
             "tests/test_b.py::test_six", "tests/test_c.py::test_doc[Using the ops]",
             "tests/test_c.py::test_doc[Using the engine]",
             "tests/test_c.py::test_schema['type' beside 'allOf' at #-schema0]"]


def test_xdist_log_leaves_the_unreported_ids_in_order():
    assert reported_ids(XDIST_LOG) == {"tests/test_a.py::test_one[x-1]", "tests/test_a.py::test_two",
                                       "tests/test_b.py::test_three[cuda-1.0]", "tests/test_b.py::test_four",
                                       "tests/test_b.py::test_five", "tests/test_c.py::test_doc[Using the ops]",
                                       "tests/test_c.py::test_schema['type' beside 'allOf' at #-schema0]"}
    assert remaining(COLLECTED, XDIST_LOG) == ["tests/test_a.py::test_one[x-2]", "tests/test_b.py::test_six",
                                               "tests/test_c.py::test_doc[Using the engine]"]


def test_plain_log_counts_only_finished_tests():
    # test_six and test_doc[Using the engine] were started (their ids printed) but have no
    # outcome: they run again; an id with spaces ends at its outcome
    assert remaining(COLLECTED, PLAIN_LOG) == ["tests/test_a.py::test_one[x-2]", "tests/test_b.py::test_four",
                                               "tests/test_b.py::test_five", "tests/test_b.py::test_six",
                                               "tests/test_c.py::test_doc[Using the engine]",
                                               "tests/test_c.py::test_schema['type' beside 'allOf' at #-schema0]"]


def test_command_collects_and_prints_the_rest(tmp_path):
    log = tmp_path / "pytest.log"
    log.write_text("[gw0] [ 50%] PASSED tests/test_pytest_rest.py::test_plain_log_counts_only_finished_tests\n")
    out = subprocess.run([sys.executable, "bench/pytest_rest.py", str(log), "tests/test_pytest_rest.py"],
                         capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.split() == ["tests/test_pytest_rest.py::test_xdist_log_leaves_the_unreported_ids_in_order",
                                  "tests/test_pytest_rest.py::test_command_collects_and_prints_the_rest"]
    assert "3 collected, 1 reported" in out.stderr
