#!/bin/sh
# Makes sure the Debian packages whose commands the tests drive are installed (`make tools` runs
# this; `make test` runs `make tools`):
#   promtool         (prometheus)       checks and unit-tests deploy/prometheus/alerts.yml
#   chromium         (chromium)         the web console's browser test
#   chromedriver     (chromium-driver)  the WebDriver server that test talks to
#   systemd-analyze  (systemd)          verifies the units in deploy/systemd
# With the argument `bench` (`make bench` runs `make bench-tools`, which runs this so), only those
# the benchmark drives instead:
#   smtp-source, smtp-sink  (postfix)   the `loopback` figure: Postfix's raw SMTP client and
#                                       sink, the bar central's dispatch is compared with
# A no-op when every command is on the PATH (or, for Postfix's, in /usr/sbin). Otherwise it
# installs the missing packages with apt-get (as root; there is no sudo here), refreshing the
# package lists first only when there are none, or when the install fails (stale lists name
# versions the mirror no longer has).
#
# The prometheus package's maintainer script starts the Prometheus server through invoke-rc.d
# when systemd is not running (a container, CI): a daemon on port 9090 that nobody asked for and
# that would outlive the test run. A policy-rc.d answering 101 ("action forbidden") stops that;
# one is put in place for the install only, and whatever policy-rc.d the machine had is restored.
# postfix is installed the same way, with debconf told "No configuration" first, so it neither
# asks a question nor configures a mail system: no daemon is started and nothing listens on
# port 25 afterwards; only its programs are wanted.
set -eu

# command:package, one per tool.
case "${1:-}" in
    "") TOOLS="promtool:prometheus chromium:chromium chromedriver:chromium-driver systemd-analyze:systemd" ;;
    bench) TOOLS="smtp-source:postfix smtp-sink:postfix" ;;
    *) echo "usage: $0 [bench]" >&2; exit 2 ;;
esac

# Whether command $1 is there: on the PATH, or where Debian puts Postfix's (a non-root PATH
# often lacks the sbin directories).
have() {
    command -v "$1" >/dev/null 2>&1 || [ -x "/usr/sbin/$1" ]
}

missing=""
for tool in $TOOLS; do
    case " $missing " in *" ${tool#*:} "*) continue ;; esac
    have "${tool%%:*}" || missing="$missing ${tool#*:}"
done
[ -z "$missing" ] && exit 0

if [ "$(id -u)" -ne 0 ]; then
    echo "make tools: missing commands from the Debian packages:$missing" >&2
    echo "  install them as root: apt-get install -y --no-install-recommends$missing" >&2
    exit 1
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "make tools: no apt-get here; install the equivalents of these Debian packages:$missing" >&2
    exit 1
fi

policy=/usr/sbin/policy-rc.d
saved="$policy.outbox-tools-saved"
restore_policy() {
    rm -f "$policy"
    if [ -e "$saved" ]; then mv "$saved" "$policy"; fi
}
if [ -e "$policy" ]; then mv "$policy" "$saved"; fi
trap restore_policy EXIT
trap 'exit 130' INT TERM
printf '#!/bin/sh\n# make tools: no service starts during its apt-get install\nexit 101\n' >"$policy"
chmod 755 "$policy"

export DEBIAN_FRONTEND=noninteractive
case " $missing " in
    *" postfix "*)
        echo "postfix postfix/main_mailer_type select No configuration" | debconf-set-selections
        ;;
esac
echo "make tools: installing Debian packages:$missing"
if ! ls /var/lib/apt/lists/*_Packages* >/dev/null 2>&1; then
    apt-get update
fi
# $missing unquoted on purpose: a list of package names.
if ! apt-get install -y --no-install-recommends $missing; then
    apt-get update
    apt-get install -y --no-install-recommends $missing
fi

for tool in $TOOLS; do
    if ! have "${tool%%:*}"; then
        echo "make tools: ${tool%%:*} is still missing after installing ${tool#*:}" >&2
        exit 1
    fi
done
if [ "${1:-}" = bench ]; then
    dpkg-query -W postfix
else
    promtool --version 2>&1 | head -n 1
    chromium --version
    chromedriver --version
    systemd-analyze --version | head -n 1
fi
