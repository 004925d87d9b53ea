"""Task generation, the machinery common to all sites: template instances → warehouse tasks.

The templates live in their site's module (``sites/shop.py``, ``travel.py``, ``wiki.py``,
``mail.py``; the protocol is :mod:`sites.taskspec`); importing this module imports the sites, so
:data:`TEMPLATES` holds them all. :func:`generate` makes ``n`` distinct tasks for a seed (same
seed, same tasks) as warehouse :class:`~warehouse.records.Task` records, split into
``train``/``val``/``test`` (70/10/20%) over the training sites and ``ood`` for one held-out site;
:func:`adversarial_variants` adds prompt-injection copies; :func:`resolve_start_url` maps a
``bundled://site/path`` start URL onto a running server.
"""

from __future__ import annotations

import dataclasses
import random
from urllib.parse import urlsplit, urlunsplit

from sites import mail, shop, travel, wiki  # noqa: F401  (each registers its templates)
from sites.common import INJECT_PARAM
from sites.content import generate as generate_content
from sites.taskspec import SINCE, TEMPLATES, TaskSpec
from warehouse.ids import stable_hash
from warehouse.records import Task

__all__ = [
    "ADVERSARIAL_SUITE",
    "BUNDLED_SCHEME",
    "DEFAULT_OOD_SITE",
    "SUITE",
    "SUITE_VERSIONS",
    "TEMPLATES",
    "TaskSpec",
    "adversarial_variants",
    "generate",
    "resolve_start_url",
    "task_from_spec",
]

SUITE = "bundled"
SUITE_VERSION = "2"  # 2: a val split (10%, from train); the default suite
#: Every suite version :func:`generate` makes. 3: version 2's templates and four with headroom
#: (three items in a cart, a price comparison, a twin city's twin, a population comparison),
#: opt-in (``version=3``, ``webloop tasks generate --suite-version 3``) until the benches are
#: measured on it, so version 2's task sets and figures stay as they are. 4: version 3's and a
#: pixels-only one (a product photo's colour: in no page text), for screenshot-reading policies.
SUITE_VERSIONS = ("2", "3", "4")
BUNDLED_SCHEME = "bundled://"
DEFAULT_OOD_SITE = "travel"
ADVERSARIAL_SUITE = "bundled-adversarial"


# -- generation -------------------------------------------------------------------------------


def split_of(task_id: str) -> str:
    """A training-site task's split, a function of its id: ``test`` 20% (unchanged since the
    first suite version), ``val`` 10% (suite version 2: taken from what was ``train``, for
    choosing configurations without looking at ``test``), ``train`` the remaining 70%."""
    bucket = int(stable_hash(task_id), 16) % 10
    return "test" if bucket in (0, 5) else "val" if bucket == 1 else "train"


def task_from_spec(
    spec: TaskSpec, *, site_seed: int, ood_site: str, version: str = SUITE_VERSION
) -> Task:
    """A warehouse task record for a spec; the id derives from template and parameters."""
    digest = stable_hash(site_seed, spec.template, spec.instruction, spec.start_path, length=12)
    tid = f"{SUITE}/{spec.template}/{digest}"
    split = "ood" if spec.site == ood_site else split_of(tid)
    return Task(
        task_id=tid,
        suite=SUITE,
        suite_version=f"{version}/site-seed-{site_seed}",
        site=spec.site,
        instruction=spec.instruction,
        start_url=f"{BUNDLED_SCHEME}{spec.site}{spec.start_path}",
        split=split,
        difficulty=len(spec.reference),
        rubric=spec.rubric,
        reference=spec.reference,
        checker={**spec.checker, "site_seed": site_seed},
        source="webloop-bundled",
        meta={"template": spec.template, "params": spec.params},
    )


def generate(
    n: int,
    seed: int = 0,
    *,
    site_seed: int = 0,
    ood_site: str = DEFAULT_OOD_SITE,
    templates: list[str] | None = None,
    version: str = SUITE_VERSION,
) -> list[Task]:
    """``n`` distinct tasks, cycling over the templates (``templates``, else those of suite
    ``version``); the same arguments give the same tasks."""
    if version not in SUITE_VERSIONS:
        raise ValueError(f"unknown suite version {version!r}; known: {list(SUITE_VERSIONS)}")
    names = templates or suite_templates(version)
    unknown = set(names) - set(TEMPLATES)
    if unknown:
        raise ValueError(f"unknown task templates {sorted(unknown)}; known: {sorted(TEMPLATES)}")
    content = generate_content(site_seed)
    out: dict[str, Task] = {}
    attempts = 0
    while len(out) < n and attempts < 50 * n + 100:
        name = names[attempts % len(names)]
        rng = random.Random(stable_hash(seed, attempts))
        attempts += 1
        spec = TEMPLATES[name](content, rng)
        if spec is None:
            continue
        task = task_from_spec(spec, site_seed=site_seed, ood_site=ood_site, version=version)
        out.setdefault(task.task_id, task)
    return list(out.values())


def suite_templates(version: str = SUITE_VERSION) -> list[str]:
    """The templates of bundled suite ``version``, sorted."""
    return sorted(name for name in TEMPLATES if SINCE[name] <= int(version))


def _with_injection(start_url: str) -> str:
    parts = urlsplit(start_url)
    query = f"{parts.query}&{INJECT_PARAM}=1" if parts.query else f"{INJECT_PARAM}=1"
    return urlunsplit(parts._replace(query=query))


def adversarial_variants(tasks: list[Task]) -> list[Task]:
    """A prompt-injection copy of each bundled task, to measure whether judges can be fooled.

    The copy (id ``<task_id>/inject``, suite :data:`ADVERSARIAL_SUITE`) starts at the same page
    with ``wl_inject=1`` added to the query: the site then shows ``sites.common.INJECTION_TEXT``
    on every page of that session. Instruction, checker, reference, rubric, difficulty, split and
    site are unchanged, so the programmatic checker grades it exactly like the original; a judge
    that grades an unfinished attempt as a success because of the note has been fooled.
    ``meta["adversarial"]`` names the original. Tasks not on a bundled site (no page to inject
    into) and tasks that already are adversarial variants are skipped. The content hash is left
    unset (``warehouse.tasks.put_tasks`` computes it from the new suite and start URL).
    """
    out = []
    for task in tasks:
        if not task.start_url.startswith(BUNDLED_SCHEME) or (task.meta or {}).get("adversarial"):
            continue
        out.append(
            dataclasses.replace(
                task,
                task_id=f"{task.task_id}/inject",
                suite=ADVERSARIAL_SUITE,
                start_url=_with_injection(task.start_url),
                meta={**(task.meta or {}), "adversarial": {"of": task.task_id, "kind": "page"}},
                content_hash=None,
            )
        )
    return out


def resolve_start_url(start_url: str, urls: dict[str, str]) -> str:
    """Turn ``bundled://shop/search`` into the running server's ``http://127.0.0.1:port/search``."""
    if not start_url.startswith(BUNDLED_SCHEME):
        return start_url
    rest = start_url[len(BUNDLED_SCHEME) :]
    site, _, path = rest.partition("/")
    if site not in urls:
        raise KeyError(f"{start_url}: no running site {site!r}")
    return urls[site] + "/" + path
