#!/usr/bin/env bash
# Makes sure the system programs webloop needs are present; fast when they already are.
#   Chromium: the system one (/usr/bin/chromium), else `apt-get install chromium` when root on
#             Debian, else Playwright's own download (`playwright install chromium`), and its
#             headless shell (chromium-headless-shell: what rollouts run; Playwright's download
#             has its own).
#   PostgreSQL server binaries (initdb, pg_ctl, postgres) for the PostgreSQL-catalog tests.
set -euo pipefail
VENV_BIN="$(cd "$(dirname "$0")/.." && pwd)/.venv/bin"
apt_updated=0

can_apt() { [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; }
apt_install() {
  if [ "$apt_updated" = 0 ]; then apt-get update -qq; apt_updated=1; fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

have_chromium() {
  [ -x /usr/bin/chromium ] || [ -x /usr/lib/chromium/chromium ] || [ -n "${WEBLOOP_CHROMIUM:-}" ]
}
if ! have_chromium; then
  if can_apt; then
    echo "setup: installing Chromium (apt-get install chromium)"
    apt_install chromium
  else
    echo "setup: installing Playwright's Chromium (playwright install chromium)"
    "$VENV_BIN/playwright" install chromium
  fi
fi

have_headless_shell() {
  [ -x /usr/lib/chromium/chromium-headless-shell ] || [ -x /usr/bin/chromium-headless-shell ] ||
    [ -n "${WEBLOOP_CHROMIUM:-}" ]
}
if ! have_headless_shell && can_apt && [ -x /usr/bin/chromium ]; then
  echo "setup: installing Chromium's headless shell (apt-get install chromium-headless-shell)"
  # optional: without it rollouts run the full Chromium headless (slower, same results)
  apt_install chromium-headless-shell ||
    echo "setup: WARNING could not install chromium-headless-shell; using the full Chromium" >&2
fi

pg_bindir() {
  if [ -n "${WEBLOOP_PG_BIN:-}" ]; then echo "$WEBLOOP_PG_BIN"; return; fi
  for d in /usr/lib/postgresql/*/bin; do [ -x "$d/initdb" ] && { echo "$d"; return; }; done
  command -v initdb >/dev/null 2>&1 && dirname "$(command -v initdb)"
}
if [ -z "$(pg_bindir)" ]; then
  if can_apt; then
    echo "setup: installing PostgreSQL server binaries (apt-get install postgresql)"
    apt_install postgresql
  else
    echo "setup: WARNING no PostgreSQL server binaries found (initdb/pg_ctl); the PostgreSQL" \
      "catalog tests need them: install PostgreSQL or set WEBLOOP_PG_BIN" >&2
  fi
fi
