"""Instances of one generated template with other parameters are distinct tasks however alike
their instructions read: neither the dedup filter nor the leakage gate confuses them (over 2,000
generated bundled tasks every train/held-out pair at similarity >= 0.92 was such a pair, so a
training build from the bundled suite always failed its leakage gate). A reworded copy of a held
out task is still caught (tests/curation/test_gates.py)."""

from __future__ import annotations

import polars as pl

from curation.embed import DEFAULT_THRESHOLD, distinct_instances, near_duplicates, template_key
from curation.gates import near_test_tasks
from sites.tasks import generate


def test_template_key_reads_meta_as_dict_or_json_and_ignores_other_tasks():
    assert template_key({"template": "t", "params": {"b": 1, "a": 2}}) == ("t", '{"a": 2, "b": 1}')
    assert template_key('{"template": "t", "params": {"a": 2}}') == ("t", '{"a": 2}')
    assert template_key(None) is None and template_key("not json") is None
    assert template_key({"source": "om2w"}) is None
    one, other = ("t", '{"a": 1}'), ("t", '{"a": 2}')
    assert distinct_instances(one, other)
    assert not distinct_instances(one, one)  # the same instance twice: a duplicate
    assert not distinct_instances(one, ("u", '{"a": 2}'))  # other templates: instructions decide
    assert not distinct_instances(one, None)  # an imported / hand-written task: instructions decide


def test_generated_instances_with_other_parameters_are_not_leakage():
    tasks = generate(300, 0)
    frame = pl.DataFrame(
        {
            "task_id": [t.task_id for t in tasks],
            "split": [t.split for t in tasks],
            "instruction": [t.instruction for t in tasks],
        }
    )
    train, held = frame.filter(pl.col("split") == "train"), frame.filter(pl.col("split") != "train")
    alike = near_duplicates(train["instruction"].to_list(), held["instruction"].to_list())
    assert len(alike) > 10  # the instructions alone look like leakage...
    keys = {t.task_id: template_key(t.meta) for t in tasks}
    near = near_test_tasks(train, held, DEFAULT_THRESHOLD, keys=keys)
    assert near["near_test_task"].null_count() == near.height  # ...the tasks are not copies
    unkeyed = near_test_tasks(train, held, DEFAULT_THRESHOLD)
    assert unkeyed["near_test_task"].null_count() < unkeyed.height


def test_a_generated_tasks_params_name_it():
    """Same template and params means the same task: the rule above relies on it (mail templates
    once left the vacation message and the mail body out of their params, so a train task and a
    held-out task with one key but other instructions read as a leak)."""
    seen: dict[tuple[str, str] | None, tuple[str, str]] = {}
    for t in generate(2000, 0):
        key = template_key(t.meta)
        assert key is not None
        assert seen.setdefault(key, (t.instruction, t.start_url)) == (t.instruction, t.start_url)
