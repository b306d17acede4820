//! `cortex mcp-token add|list|revoke`: tokens that reach only the hub's `/mcp`, one per
//! agent or client (`/api/mcp/tokens`).

use std::io::Write;

use anyhow::Context;
use cortex_protocol::api::{CreateMcpToken, McpTokenCreated, McpTokenView};

use super::print_raw;
use crate::hub::{Hub, segment};

pub fn add(hub: &Hub, name: &str, json: bool, out: &mut dyn Write) -> anyhow::Result<()> {
    let reply = hub
        .post(
            "/api/mcp/tokens",
            &CreateMcpToken {
                name: name.to_string(),
            },
        )
        .with_context(|| format!("adding MCP token {name}"))?;
    if json {
        return print_raw(out, &reply);
    }
    let t: McpTokenCreated = reply.json("POST /api/mcp/tokens")?;
    writeln!(
        out,
        "MCP token {} added. The token, shown this once (the hub keeps only a hash):\n\n    {}\n\n\
         It reaches only /mcp. Give it to the client as its bearer, or to cortex mcp:\n\n    \
         CORTEX_WEBHOOK_TOKEN='{}' cortex mcp",
        t.name, t.token, t.token
    )?;
    Ok(())
}

pub fn list(hub: &Hub, json: bool, out: &mut dyn Write) -> anyhow::Result<()> {
    let reply = hub.get("/api/mcp/tokens").context("listing MCP tokens")?;
    if json {
        return print_raw(out, &reply);
    }
    let all: Vec<McpTokenView> = reply.json("GET /api/mcp/tokens")?;
    if all.is_empty() {
        writeln!(out, "no MCP tokens (cortex mcp-token add NAME makes one)")?;
    }
    for t in all {
        writeln!(out, "{}\t{}", t.name, crate::timefmt::utc(t.created_at))?;
    }
    Ok(())
}

pub fn revoke(hub: &Hub, name: &str, json: bool, out: &mut dyn Write) -> anyhow::Result<()> {
    let reply = hub
        .delete(&format!("/api/mcp/tokens/{}", segment(name)))
        .with_context(|| format!("revoking MCP token {name}"))?;
    if json {
        return print_raw(out, &reply);
    }
    writeln!(
        out,
        "MCP token {name} revoked: it reaches nothing from now on"
    )?;
    Ok(())
}
