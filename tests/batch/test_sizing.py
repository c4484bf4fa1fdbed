"""Sizing a batch's workers by the thread plan, CPU slots of one machine, and the command's
refusals that need no model."""
from __future__ import annotations

import pytest

from app.batch.pools import size_workers
from app.batch.slots import claim_slot, parse_cpulist


@pytest.mark.parametrize("workers, threads, cores, cluster, expected", [
    (None, 0, 8, False, (1, 8)),        # the default: one worker on every core
    (None, 2, 8, False, (4, 2)),        # threads given: as many workers as fit
    (4, 0, 8, False, (4, 2)),           # workers given: the cores shared out
    (3, 0, 8, False, (3, 2)),
    (2, 1, 2, False, (2, 1)),
    (None, 4, 8, True, (0, 4)),         # a cluster: workers from its CPUs, once connected
    (16, 4, 8, True, (16, 4)),          # a cluster's workers are not bound by this machine's cores
])
def test_workers_times_threads_fit_the_cores(workers, threads, cores, cluster, expected):
    assert size_workers(workers, threads, cores, cluster) == expected


def test_more_workers_than_cores_is_refused_with_the_numbers():
    with pytest.raises(ValueError, match="3 workers x 1 threads is more than the 2 physical cores"):
        size_workers(3, 1, 2)
    with pytest.raises(ValueError, match="workers must be 1 or more"):
        size_workers(0, 0, 2)


def test_slots_take_disjoint_cores_and_a_released_slot_is_taken_again(tmp_path):
    cores = [(0, 4), (1, 5), (2, 6), (3, 7)]   # four cores with SMT siblings
    a = claim_slot(2, tmp_path, cores)
    b = claim_slot(2, tmp_path, cores)
    c = claim_slot(2, tmp_path, cores)         # beyond the cores: runs where the OS puts it
    assert (a.index, a.cpus) == (0, (0, 4, 1, 5)) and (b.index, b.cpus) == (1, (2, 6, 3, 7))
    assert (c.index, c.cpus) == (2, ())
    a.release()
    assert claim_slot(2, tmp_path, cores).index == 0
    assert parse_cpulist("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]


def test_a_results_file_of_another_kind_is_refused_before_anything_loads(cli):
    rc, _, err = cli("batch", "--all", "--ask", "Q?", "--out", "results.txt")
    assert rc == 1 and "results.txt: the results file must end in .csv, .jsonl or .md" in err


def test_a_questions_file_gives_one_question_a_line_and_an_empty_one_is_refused(cli, tmp_path):
    from app.batch.spec import read_questions

    path = tmp_path / "questions.txt"
    path.write_text("# the contract's dates\nWhen was it signed?\n\n  When does it end?  \n", encoding="utf-8")
    assert read_questions(str(path)) == ["When was it signed?", "When does it end?"]
    path.write_text("# nothing yet\n\n", encoding="utf-8")
    rc, _, err = cli("batch", "--all", "--questions", str(path), "--out", str(tmp_path / "r.csv"))
    assert rc == 1 and f"{path}: no questions in it" in err
