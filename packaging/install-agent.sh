#!/bin/sh
# Install cortex-device-agent on a device (a trainer box) as a systemd service for one user.
#
#   sudo ./install-agent.sh --hub wss://hub.example:3002/mesh/v1 --name gpu1 < token
#
# --hub may be repeated for hubs that share one store (a standby): the agent links to one
# at a time, in order, and moves to the next when that one dies.
#
# It installs the binary (/usr/local/bin, named in the unit), the unit cortex-device-agent@.service
# (/etc/systemd/system), /etc/cortex/device-agent.env (hub URL, device name, CA) and
# /etc/cortex/device-agent.token (root, 0600; systemd hands it to the agent as a
# credential), creates the user's spool (~/.cortex/tmp/signals, 0700), and enables
# cortex-device-agent@USER. Run it again to change the hub, the name or the token.
#
# The token is read from --token-file or stdin, never from the command line (which other
# users can read in ps).
set -eu

usage() {
    cat <<'EOF'
usage: install-agent.sh --hub URL --name NAME [options] < TOKEN

  --hub URL          the hub's mesh URL, wss://HOST:3002/mesh/v1 (ws:// only to this machine);
                     repeat it for several hubs on one store, tried in order
  --name NAME        this device's name, as given to `cortex device add NAME` on the hub
  --user USER        whose spool to forward and as whom to run (default: $SUDO_USER)
  --token-file FILE  read the token from FILE instead of stdin
  --binary PATH      the cortex-device-agent binary, installed in /usr/local/bin
                     (default: next to this script, or ./cortex-device-agent; none when
                     a package installed /usr/bin's, which the unit then runs)
  --ca-cert PEM      trust this CA for the hub's certificate (a private CA)
  --root DIR         install under DIR instead of /, and skip chown and systemctl
                     (for packaging and tests)
EOF
}

die() {
    echo "install-agent.sh: $*" >&2
    exit 1
}

hub="" name="" user="${SUDO_USER:-}" token_file="" binary="" ca="" root=""
while [ $# -gt 0 ]; do
    case "$1" in
        --hub) hub="${hub:+$hub,}${2:?--hub needs a URL}"; shift 2 ;;
        --name) name="${2:?--name needs a name}"; shift 2 ;;
        --user) user="${2:?--user needs a user}"; shift 2 ;;
        --token-file) token_file="${2:?--token-file needs a file}"; shift 2 ;;
        --binary) binary="${2:?--binary needs a path}"; shift 2 ;;
        --ca-cert) ca="${2:?--ca-cert needs a PEM file}"; shift 2 ;;
        --root) root="${2:?--root needs a directory}"; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        *) usage >&2; die "unknown argument: $1" ;;
    esac
done

[ -n "$hub" ] || { usage >&2; die "--hub is required"; }
[ -n "$name" ] || { usage >&2; die "--name is required"; }
[ -n "$user" ] || die "no user: pass --user USER (the one whose ~/.cortex/tmp/signals to forward)"
# Several hubs become CORTEX_HUB_URL's comma-separated list; each must be a WebSocket URL.
case "$hub" in
    ,*|*,|*,,*) die "--hub got an empty URL (a stray comma in '$hub')" ;;
esac
old_ifs=$IFS
IFS=,
for h in $hub; do
    case "$h" in
        ws://*|wss://*) ;;
        *) die "--hub must be a ws:// or wss:// URL, like wss://hub.example:3002/mesh/v1 (got '$h')" ;;
    esac
done
IFS=$old_ifs
if [ -z "$root" ] && [ "$(id -u)" != 0 ]; then
    die "run as root (sudo): it writes /etc and enables a system service"
fi

here=$(cd "$(dirname "$0")" && pwd)
# From the source tree the unit is beside the script; the .deb installs its own.
unit_src="$here/systemd/cortex-device-agent@.service"
packaged_unit=""
for u in /lib/systemd/system/cortex-device-agent@.service /usr/lib/systemd/system/cortex-device-agent@.service; do
    if [ -f "$root$u" ]; then packaged_unit="$u"; fi
done
if [ ! -f "$unit_src" ] && [ -z "$packaged_unit" ]; then
    die "cannot find $unit_src; run the script from the cortex source tree or release archive"
fi

passwd=$(getent passwd "$user") || die "no such user: $user"
home=$(echo "$passwd" | cut -d: -f6)
group=$(id -gn "$user")
[ -n "$home" ] || die "user $user has no home directory"

# The token: one line, from a file or stdin.
if [ -n "$token_file" ]; then
    token=$(head -n 1 "$token_file") || die "cannot read $token_file"
else
    if [ -t 0 ]; then
        echo "Paste the device token (from \`cortex device add $name\` on the hub), then Enter:" >&2
    fi
    IFS= read -r token || true
fi
token=$(printf '%s' "$token" | tr -d '[:space:]')
[ -n "$token" ] || die "no token: pipe it on stdin or pass --token-file FILE"

# The binary, unless a package already installed one.
if [ -z "$binary" ]; then
    for b in "$here/cortex-device-agent" "./cortex-device-agent" "$here/../target/release/cortex-device-agent"; do
        if [ -f "$b" ]; then binary="$b"; break; fi
    done
fi
if [ -n "$binary" ]; then
    [ -x "$binary" ] || die "$binary is not an executable"
    install -D -m 755 "$binary" "$root/usr/local/bin/cortex-device-agent"
elif [ ! -x "$root/usr/bin/cortex-device-agent" ] && [ ! -x "$root/usr/local/bin/cortex-device-agent" ]; then
    die "no cortex-device-agent binary: pass --binary PATH"
fi

# The unit names the binary's path: the package's (/usr/bin) as shipped, else this
# script's (/usr/local/bin).
if [ -z "$binary" ] && [ -x "$root/usr/bin/cortex-device-agent" ]; then
    agent_path=/usr/bin/cortex-device-agent
else
    agent_path=/usr/local/bin/cortex-device-agent
fi
bin_dropin="$root/etc/systemd/system/cortex-device-agent@.service.d"
if [ -f "$unit_src" ] && [ -z "$packaged_unit" ]; then
    unit_dst="$root/etc/systemd/system/cortex-device-agent@.service"
    install -d -m 755 "$(dirname "$unit_dst")"
    sed "s|^ExecStart=/usr/bin/cortex-device-agent|ExecStart=$agent_path|" "$unit_src" > "$unit_dst.tmp"
    chmod 644 "$unit_dst.tmp"
    mv "$unit_dst.tmp" "$unit_dst"
elif [ "$agent_path" != /usr/bin/cortex-device-agent ]; then
    # The package's unit runs /usr/bin's; the binary installed here is the one wanted.
    install -d -m 755 "$bin_dropin"
    cat > "$bin_dropin/binary.conf" <<EOF
# install-agent.sh --binary: the agent in /usr/local/bin, not the package's.
[Service]
ExecStart=
ExecStart=$agent_path
EOF
else
    rm -f "$bin_dropin/binary.conf"
fi

install -d -m 755 "$root/etc/cortex"
env_file="$root/etc/cortex/device-agent.env"
{
    echo "# cortex-device-agent's settings (install-agent.sh); the token is in device-agent.token."
    echo "CORTEX_HUB_URL=$hub"
    echo "CORTEX_DEVICE_NAME=$name"
    if [ -n "$ca" ]; then
        install -m 644 "$ca" "$root/etc/cortex/ca.pem"
        echo "CORTEX_CA_CERT=/etc/cortex/ca.pem"
    fi
} > "$env_file.tmp"
chmod 644 "$env_file.tmp"
mv "$env_file.tmp" "$env_file"

# Written through a 0600 temporary so it is never readable by others, even briefly.
token_path="$root/etc/cortex/device-agent.token"
(
    umask 077
    printf '%s\n' "$token" > "$token_path.tmp"
)
mv "$token_path.tmp" "$token_path"

# The spool, owned by the user and private to them. Existing directories are left as
# they are (the agent refuses a spool others can write to, and says what to change).
for d in "$home/.cortex" "$home/.cortex/tmp" "$home/.cortex/tmp/signals"; do
    if [ ! -d "$root$d" ]; then
        install -d -m 700 "$root$d"
        [ -n "$root" ] || chown "$user:$group" "$d"
    fi
done

# The unit names /home/USER; another home needs its own paths.
dropin="$root/etc/systemd/system/cortex-device-agent@$user.service.d"
if [ "$home" != "/home/$user" ]; then
    install -d -m 755 "$dropin"
    cat > "$dropin/home.conf" <<EOF
# install-agent.sh: $user's home is $home, not /home/$user.
[Service]
Environment=CORTEX_HOME=$home/.cortex
ReadWritePaths=
ReadWritePaths=$home/.cortex
EOF
else
    rm -f "$dropin/home.conf"
fi

if [ -n "$root" ]; then
    echo "installed under $root (no systemctl)"
    exit 0
fi
systemctl daemon-reload
systemctl enable "cortex-device-agent@$user.service"
systemctl restart "cortex-device-agent@$user.service"
echo "cortex-device-agent@$user is running. Check it with:"
echo "  systemctl status cortex-device-agent@$user"
echo "  journalctl -u cortex-device-agent@$user -f"
