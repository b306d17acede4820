//! `cortex devices` and `cortex device add|revoke|remove NAME`: the fleet's status, enrolling a
//! device (its token is printed this once, with the line that starts its agent) and
//! revoking one (its link is dropped at once). The list shows every device the hub lists,
//! in the state it gives, with the host facts its agent's hello told (`-` when unknown)
//! and, while online, the hub that holds its link.

use std::io::Write;

use anyhow::Context;
use cortex_protocol::api::{CreateDevice, DeviceCreated, DeviceView};
use cortex_protocol::mesh::HostFacts;

use super::{print_raw, short, table};
use crate::hub::{Hub, HubError, segment};
use crate::timefmt::{now_ms, relative};

pub fn list(hub: &Hub, json: bool, out: &mut dyn Write) -> anyhow::Result<()> {
    let reply = hub.get("/api/devices").context("listing the devices")?;
    if json {
        return print_raw(out, &reply);
    }
    let devices: Vec<DeviceView> = reply.json("GET /api/devices")?;
    if devices.is_empty() {
        writeln!(
            out,
            "no devices yet; enrol one with: cortex device add NAME"
        )?;
        return Ok(());
    }
    let now = now_ms();
    let when = |t: Option<u64>| t.map_or_else(|| "-".to_string(), |t| relative(t, now));
    let rows: Vec<Vec<String>> = devices
        .iter()
        .map(|d| {
            // Whatever state the hub gives is shown (`revoked` included): every device it
            // lists is a row, as `tailscale status` shows every peer.
            let state = match (&d.state[..], &d.offline_reason, d.last_seen) {
                ("offline", _, None) => "never connected".to_string(),
                ("offline", Some(r), _) => format!("offline ({})", short(r, 40)),
                (s, _, _) => s.to_string(),
            };
            vec![
                d.name.clone(),
                state,
                host(d.host.as_ref()),
                gpus(d.host.as_ref()),
                when(d.since),
                when(d.last_seen),
                d.agent_version.clone().unwrap_or_else(|| "-".into()),
                format!("{}/{}", d.spool.pending, d.spool.bad),
                d.waits.to_string(),
                d.hub.clone().unwrap_or_else(|| "-".into()),
            ]
        })
        .collect();
    table(
        out,
        &[
            "NAME",
            "STATE",
            "HOST",
            "GPUS",
            "SINCE",
            "LAST SEEN",
            "AGENT",
            "SPOOL PENDING/BAD",
            "WAITS",
            "HUB",
        ],
        &rows,
    )
}

/// The HOST cell: hostname, CPUs and kernel, as the agent's hello told them; `-` for a
/// device that never said (never connected, or an older agent).
fn host(h: Option<&HostFacts>) -> String {
    let Some(h) = h else {
        return "-".to_string();
    };
    let mut parts = Vec::new();
    if h.cpus > 0 {
        parts.push(format!("{} CPUs", h.cpus));
    }
    if !h.kernel.is_empty() {
        parts.push(h.kernel.clone());
    }
    match (h.hostname.is_empty(), parts.is_empty()) {
        (true, true) => "-".to_string(),
        (false, true) => h.hostname.clone(),
        (true, false) => parts.join(", "),
        (false, false) => format!("{} ({})", h.hostname, parts.join(", ")),
    }
}

/// The GPUS cell: each model's short name with its count, like `2×A100` or
/// `2×A100+1×H100`; `-` when none were seen or the device never said.
pub fn gpus(h: Option<&HostFacts>) -> String {
    let mut counts: Vec<(String, usize)> = Vec::new();
    for name in h.map(|h| h.gpus.as_slice()).unwrap_or_default() {
        let model = gpu_model(name);
        match counts.iter_mut().find(|(m, _)| *m == model) {
            Some((_, n)) => *n += 1,
            None => counts.push((model, 1)),
        }
    }
    if counts.is_empty() {
        return "-".to_string();
    }
    counts
        .iter()
        .map(|(m, n)| format!("{n}×{m}"))
        .collect::<Vec<_>>()
        .join("+")
}

/// A GPU's model without the vendor and the board's variant: `NVIDIA A100-SXM4-80GB` is
/// `A100`, `NVIDIA GeForce RTX 4090` is `RTX 4090`, `Tesla V100-PCIE-16GB` is `V100`.
fn gpu_model(name: &str) -> String {
    let mut words: Vec<&str> = name.split_whitespace().collect();
    while words
        .first()
        .is_some_and(|w| ["NVIDIA", "GeForce", "Tesla", "Quadro"].contains(w))
        && words.len() > 1
    {
        words.remove(0);
    }
    let cut = |w: &str| w.split('-').next().unwrap_or(w).to_string();
    match words.as_slice() {
        [] => "?".to_string(),
        [first, second, ..] if !first.chars().any(|c| c.is_ascii_digit()) => {
            format!("{first} {}", cut(second))
        }
        [first, ..] => cut(first),
    }
}

/// The one line for a device the hub does not know.
pub fn unknown(name: &str) -> String {
    format!("no device named {name} (cortex devices lists them)")
}

/// Device `name` as the hub has it; a device it does not know is an error saying so in
/// one line ([`unknown`]).
pub fn require(hub: &Hub, name: &str) -> anyhow::Result<DeviceView> {
    match hub.get(&format!("/api/devices/{}", segment(name))) {
        Ok(r) => Ok(r.json("GET /api/devices/{name}")?),
        Err(e) if e.status() == Some(404) => anyhow::bail!(unknown(name)),
        Err(e) => Err(e).with_context(|| format!("looking up device {name}")),
    }
}

/// Whether a hub's 404 to a request naming a device is about the device (not, say, the
/// session): its words name it.
pub fn is_unknown(e: &crate::hub::HubError, name: &str) -> bool {
    match e {
        crate::hub::HubError::Api {
            status: 404,
            message,
            error,
        } => {
            message.contains(&format!("device {name:?}"))
                || message.contains(&format!("device {name}"))
                || error.as_deref() == Some("unknown_device")
        }
        _ => false,
    }
}

pub fn add(hub: &Hub, name: &str, json: bool, out: &mut dyn Write) -> anyhow::Result<()> {
    let reply = hub
        .post(
            "/api/devices",
            &CreateDevice {
                name: name.to_string(),
            },
        )
        .with_context(|| format!("adding device {name}"))?;
    if json {
        return print_raw(out, &reply);
    }
    let d: DeviceCreated = reply.json("POST /api/devices")?;
    write!(
        out,
        "device {name} added. Its token, shown this once (the hub keeps only a hash):\n\n    {token}\n\n\
         On {name}, save the token where only you can read it, then start the agent:\n\n    \
         (umask 077; mkdir -p ~/.cortex && printf '%s\\n' '{token}' > ~/.cortex/device-token)\n    \
         {install}\n\n\
         or in one line, with the token in the environment:\n\n    \
         CORTEX_DEVICE_TOKEN='{token}' {env_form}\n",
        name = d.name,
        token = d.token,
        install = d.install,
        env_form = d
            .install
            .replace(" --token-file ~/.cortex/device-token", ""),
    )?;
    if loopback_hub(&d.install) {
        writeln!(
            out,
            "\nThe hub's mesh listens on loopback only, which another machine cannot reach: start the hub\n\
             with --mesh-listen 0.0.0.0:3002 --tls-cert PEM --tls-key PEM and use its host name in --hub."
        )?;
    }
    Ok(())
}

/// Whether the install line's `--hub` points at a loopback address.
fn loopback_hub(install: &str) -> bool {
    install.contains("://127.") || install.contains("://[::1]") || install.contains("://localhost")
}

/// `cortex device revoke NAME [--remove]`. A device already revoked is the hub's 409
/// `already_revoked` (exit 1, its message says so), unless `remove` asks for the listing
/// to go too: then it is only removed.
pub fn revoke(
    hub: &Hub,
    name: &str,
    remove: bool,
    json: bool,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    let asked = hub.delete(&format!("/api/devices/{}", segment(name)));
    let reply = match asked {
        Err(HubError::Api {
            status: 409,
            error: Some(code),
            ..
        }) if remove && code == "already_revoked" => None,
        Err(e) => return Err(anyhow::Error::new(e).context(format!("revoking device {name}"))),
        Ok(r) => Some(r),
    };
    if let Some(reply) = reply {
        if json && !remove {
            return print_raw(out, &reply);
        }
        let v: serde_json::Value = reply.json("DELETE /api/devices/{name}")?;
        // With --remove and --json, the removal's answer is the one printed.
        if !json {
            let how = if v["dropped_link"].as_bool() == Some(true) {
                "its link was dropped and its token no longer works"
            } else {
                "its token no longer works (it was not connected)"
            };
            writeln!(out, "device {name} revoked; {how}")?;
        }
    }
    if remove {
        return self::remove(hub, name, json, out);
    }
    Ok(())
}

/// `cortex device remove NAME`: a revoked device leaves the list.
pub fn remove(hub: &Hub, name: &str, json: bool, out: &mut dyn Write) -> anyhow::Result<()> {
    let reply = hub
        .delete(&format!("/api/devices/{}/revoked", segment(name)))
        .with_context(|| format!("removing device {name}"))?;
    if json {
        return print_raw(out, &reply);
    }
    writeln!(
        out,
        "device {name} removed from the list; `cortex device add {name}` enrols it again"
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(gpus: &[&str]) -> HostFacts {
        HostFacts {
            hostname: "box".into(),
            kernel: "6.1.0".into(),
            cpus: 64,
            gpus: gpus.iter().map(|g| g.to_string()).collect(),
        }
    }

    #[test]
    fn gpus_are_summed_up_by_model() {
        assert_eq!(gpus(None), "-");
        assert_eq!(gpus(Some(&facts(&[]))), "-");
        assert_eq!(
            gpus(Some(&facts(&[
                "NVIDIA A100-SXM4-80GB",
                "NVIDIA A100-SXM4-80GB"
            ]))),
            "2×A100"
        );
        assert_eq!(
            gpus(Some(&facts(&[
                "NVIDIA H100 80GB HBM3",
                "NVIDIA GeForce RTX 4090",
                "Tesla V100-PCIE-16GB",
                "NVIDIA H100 80GB HBM3",
            ]))),
            "2×H100+1×RTX 4090+1×V100"
        );
    }

    #[test]
    fn host_facts_tolerate_gaps() {
        assert_eq!(host(None), "-");
        assert_eq!(host(Some(&facts(&[]))), "box (64 CPUs, 6.1.0)");
        assert_eq!(host(Some(&HostFacts::default())), "-");
        let only_name = HostFacts {
            hostname: "box".into(),
            ..HostFacts::default()
        };
        assert_eq!(host(Some(&only_name)), "box");
    }
}
