"""``mail``: inbox with folders, reading, replying, composing and settings — for
state-changing tasks."""

from __future__ import annotations

import datetime as dt
import random
import re
from typing import Any

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from sites.common import SiteContext, make_app, route
from sites.content import FIRST, LAST, Content, Message
from sites.taskspec import ACCEPT_COOKIES, TaskSpec, click, template, type_

FOLDERS = ("inbox", "archive", "sent", "trash")
ME = "sam.agent@example.org"


def new_state() -> dict[str, Any]:
    return {
        "sent": [],
        "moved": {},
        "read": [],
        "settings": {
            "display_name": "Sam Agent",
            "signature": "",
            "vacation": False,
            "vacation_message": "",
        },
    }


def folder_of(st: dict[str, Any], m: Message) -> str:
    return st["moved"].get(m.mid, m.folder)


def listing(content: Content, st: dict[str, Any], folder: str) -> list[dict[str, Any]]:
    if folder == "sent":
        return [
            {
                "mid": s["sid"],
                "who": s["to"],
                "subject": s["subject"],
                "date": "today",
                "unread": False,
                "sent": True,
            }
            for s in reversed(st["sent"])
        ]
    return [
        {
            "mid": m.mid,
            "who": m.sender_name,
            "subject": m.subject,
            "date": m.date,
            "unread": m.mid not in st["read"],
            "sent": False,
        }
        for m in content.messages
        if folder_of(st, m) == folder
    ]


# -- pages: each handler takes the site's context first (bound by sites.common.route) ----


async def home(ctx: SiteContext, request: Request) -> Response:
    return RedirectResponse("/folder/inbox", status_code=303)


async def folder(ctx: SiteContext, request: Request) -> Response:
    c = ctx.content
    name = request.path_params["name"]
    if name not in FOLDERS:
        return ctx.render(request, "mail/notfound.html", status=404)
    st = ctx.state(request)
    return ctx.render(
        request,
        "mail/folder.html",
        folder=name,
        folders=FOLDERS,
        items=listing(c, st, name),
        flash=request.query_params.get("flash"),
    )


async def message(ctx: SiteContext, request: Request) -> Response:
    c = ctx.content
    m = c.message_by_id.get(request.path_params["mid"])
    if m is None:
        return ctx.render(request, "mail/notfound.html", status=404)
    st = ctx.state(request)
    if m.mid not in st["read"]:
        st["read"].append(m.mid)
    return ctx.render(request, "mail/message.html", m=m, folders=FOLDERS, folder=folder_of(st, m))


async def move(ctx: SiteContext, request: Request) -> Response:
    c = ctx.content
    m = c.message_by_id.get(request.path_params["mid"])
    form = await request.form()
    target = str(form.get("folder", ""))
    if m is None or target not in ("inbox", "archive", "trash"):
        return RedirectResponse("/folder/inbox", status_code=303)
    ctx.state(request)["moved"][m.mid] = target
    return RedirectResponse(f"/folder/inbox?flash=Moved+to+{target}", status_code=303)


async def compose(ctx: SiteContext, request: Request) -> Response:
    c = ctx.content
    st = ctx.state(request)
    if request.method == "GET":
        form = {}
        reply = c.message_by_id.get(request.query_params.get("reply_to", ""))
        if reply:
            form = {
                "to": reply.sender,
                "subject": f"Re: {reply.subject}",
                "reply_to": reply.mid,
            }
        sig = st["settings"]["signature"]
        if sig:
            form["body"] = f"\n\n-- \n{sig}"
        return ctx.render(
            request, "mail/compose.html", form=form, errors={}, folders=FOLDERS, folder=""
        )
    form = {k: str(v) for k, v in (await request.form()).items()}
    errors = {}
    if not re.fullmatch(r"[^@\s,]+@[^@\s,]+\.[a-z]{2,}", form.get("to", "").strip()):
        errors["to"] = "Enter one valid email address."
    if not form.get("subject", "").strip():
        errors["subject"] = "Subject is required."
    if errors:
        return ctx.render(
            request,
            "mail/compose.html",
            status=422,
            form=form,
            errors=errors,
            folders=FOLDERS,
            folder="",
        )
    st["sent"].append(
        {
            "sid": f"s{len(st['sent']) + 1:03d}",
            "to": form["to"].strip(),
            "subject": form["subject"].strip(),
            "body": form.get("body", ""),
            "reply_to": form.get("reply_to") or None,
        }
    )
    return RedirectResponse("/folder/sent?flash=Message+sent", status_code=303)


async def settings(ctx: SiteContext, request: Request) -> Response:
    st = ctx.state(request)
    if request.method == "POST":
        form = await request.form()
        st["settings"] = {
            "display_name": str(form.get("display_name", "")).strip(),
            "signature": str(form.get("signature", "")).strip(),
            "vacation": form.get("vacation") == "on",
            "vacation_message": str(form.get("vacation_message", "")).strip(),
        }
        return RedirectResponse("/settings?saved=1", status_code=303)
    return ctx.render(
        request,
        "mail/settings.html",
        s=st["settings"],
        folders=FOLDERS,
        folder="",
        saved=request.query_params.get("saved"),
    )


def build(ctx: SiteContext):
    """The site's app: the handlers above, each bound to ``ctx``, on their routes."""
    return make_app(
        ctx,
        [
            route("/", home, ctx),
            route("/folder/{name}", folder, ctx),
            route("/message/{mid}", message, ctx),
            route("/message/{mid}/move", move, ctx, methods=["POST"]),
            route("/compose", compose, ctx, methods=["GET", "POST"]),
            route("/settings", settings, ctx, methods=["GET", "POST"]),
        ],
    )


# -- tasks: this site's templates, registered for sites.tasks.generate -----------------------------


_PHRASES = [
    "I can join on Thursday",
    "Please send the slides",
    "Count me in",
    "Let's move it to Monday",
    "Thanks, approved",
    "I will review it tomorrow",
    "Can we discuss this at 3pm",
    "Looks good to me",
    "I need one more day",
    "Please add Grace to the thread",
]


def _open_message(mid: str) -> str:
    return click(f"a.message-link[href='/message/{mid}']")


@template("mail_reply")
def mail_reply(c: Content, rng: random.Random) -> TaskSpec:
    m = rng.choice(c.messages)
    phrase = rng.choice(_PHRASES)
    return TaskSpec(
        "mail_reply",
        "mail",
        f'Reply to the email "{m.subject}" from {m.sender_name} with the message: {phrase}',
        "/",
        [f'A reply to "{m.subject}" was sent to {m.sender}', f'The reply says "{phrase}"'],
        {"kind": "mail.sent", "to": m.sender, "reply_to": m.mid, "body_contains": phrase},
        [
            ACCEPT_COOKIES,
            _open_message(m.mid),
            click("#reply"),
            type_("#body", phrase),
            click("#send"),
        ],
        {"mid": m.mid, "phrase": phrase},
    )


@template("mail_compose")
def mail_compose(c: Content, rng: random.Random) -> TaskSpec:
    first, last = rng.choice(FIRST), rng.choice(LAST)
    to = f"{first.lower()}.{last.lower()}@example.org"
    subject = (
        f"{rng.choice(['Notes on', 'Question about', 'Update:', 'Follow-up:'])} "
        f"{rng.choice(['the roadmap', 'the budget', 'the offsite', 'the launch'])}"
    )
    phrase = rng.choice(_PHRASES)
    return TaskSpec(
        "mail_compose",
        "mail",
        f'Send a new email to {to} with the subject "{subject}" that says: {phrase}',
        "/",
        [f"An email was sent to {to}", f'Its subject is "{subject}"', f'It says "{phrase}"'],
        {"kind": "mail.sent", "to": to, "subject_contains": subject, "body_contains": phrase},
        [
            ACCEPT_COOKIES,
            click("#compose-link"),
            type_("#to", to),
            type_("#subject", subject),
            type_("#body", phrase),
            click("#send"),
        ],
        {"to": to, "subject": subject, "phrase": phrase},
    )


@template("mail_archive")
def mail_archive(c: Content, rng: random.Random) -> TaskSpec:
    m = rng.choice(c.messages)
    return TaskSpec(
        "mail_archive",
        "mail",
        f'Archive the email "{m.subject}" from {m.sender_name}.',
        "/",
        [f'"{m.subject}" is in the Archive folder'],
        {"kind": "mail.moved", "mid": m.mid, "folder": "archive"},
        [ACCEPT_COOKIES, _open_message(m.mid), click("#archive")],
        {"mid": m.mid},
    )


@template("mail_settings")
def mail_settings(c: Content, rng: random.Random) -> TaskSpec:
    first, last = rng.choice(FIRST), rng.choice(LAST)
    sig = f"{first} {last} · {rng.choice(['Platform team', 'Research', 'Operations'])}"
    back = (c.today + dt.timedelta(days=rng.randint(3, 30))).isoformat()
    msg = f"I am away until {back}."
    return TaskSpec(
        "mail_settings",
        "mail",
        f'Set your email signature to "{sig}" and turn on the vacation responder with the '
        f'message "{msg}"',
        "/",
        [
            f'The signature is "{sig}"',
            "The vacation responder is on",
            f'The vacation message is "{msg}"',
        ],
        {
            "kind": "mail.settings",
            "settings": {"signature": sig, "vacation": True, "vacation_message": msg},
        },
        [
            ACCEPT_COOKIES,
            click("#settings-link"),
            type_("#signature", sig),
            click("#vacation"),
            type_("#vacation_message", msg),
            click("#save-settings"),
        ],
        {"signature": sig, "vacation_message": msg},
    )
