//! `cortex devices` and `cortex device add|revoke NAME`: the fleet's status, enrolling a
//! device (its token is printed this once, with the line that starts its agent) and
//! revoking one (its link is dropped at once).

use std::io::Write;

use anyhow::Context;
use cortex_protocol::api::{CreateDevice, DeviceCreated, DeviceView};

use super::{print_raw, short, table};
use crate::hub::{Hub, segment};
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
            let state = match (&d.state[..], &d.offline_reason, d.last_seen) {
                ("offline", _, None) => "never connected".to_string(),
                ("offline", Some(r), _) => format!("offline ({})", short(r, 40)),
                (s, _, _) => s.to_string(),
            };
            vec![
                d.name.clone(),
                state,
                when(d.since),
                when(d.last_seen),
                d.agent_version.clone().unwrap_or_else(|| "-".into()),
                format!("{}/{}", d.spool.pending, d.spool.bad),
                d.waits.to_string(),
            ]
        })
        .collect();
    table(
        out,
        &[
            "NAME",
            "STATE",
            "SINCE",
            "LAST SEEN",
            "AGENT",
            "SPOOL PENDING/BAD",
            "WAITS",
        ],
        &rows,
    )
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

pub fn revoke(hub: &Hub, name: &str, json: bool, out: &mut dyn Write) -> anyhow::Result<()> {
    let reply = hub
        .delete(&format!("/api/devices/{}", segment(name)))
        .with_context(|| format!("revoking device {name}"))?;
    if json {
        return print_raw(out, &reply);
    }
    let v: serde_json::Value = reply.json("DELETE /api/devices/{name}")?;
    if v["dropped_link"].as_bool() == Some(true) {
        writeln!(
            out,
            "device {name} revoked; its link was dropped and its token no longer works"
        )?;
    } else {
        writeln!(
            out,
            "device {name} revoked; its token no longer works (it was not connected)"
        )?;
    }
    Ok(())
}
