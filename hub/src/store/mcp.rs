//! MCP clients as outside agents: a *connection* (an MCP session, or the requests a
//! client without one names alike) is bound to the token its first call carried and to
//! one cortex session, a mailbox its waits are armed in; a *task* is a wait a client
//! asked for as an MCP task: bound to its caller's token, it completes when its
//! waitpoint wakes. Both live here, so a restart (or another hub on the database) serves
//! them as before. Connection ids are kept hashed: the id is the client's to prove.

use serde::{Deserialize, Serialize};

use super::agent::AgentRecord;
use super::kernel::error::StoreError;
use super::tables::{MCP_CONNECTIONS, MCP_TASKS, MCP_TOKENS, Tx, decode, encode};
use crate::secret;

/// Connections unused for this long are forgotten (their sessions stay).
pub const CONNECTION_KEPT_MS: u64 = 30 * 24 * 3_600_000;
/// Tasks are kept this long after they were made, then forgotten (their waitpoints and
/// wakes stay in their sessions).
pub const TASK_KEPT_MS: u64 = 30 * 24 * 3_600_000;
/// Tasks one token may hold at once; a client past it is told to let some end.
pub const MAX_TASKS_PER_OWNER: usize = 4096;

/// One MCP connection.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct McpConnection {
    /// The client's `initialize` parameters (JSON), to serve the connection again after
    /// a restart without a new handshake; empty for a connection without one.
    pub init: String,
    pub created_at: u64,
    pub used_at: u64,
    /// SHA-256 of the token its first call carried: every later call must carry it.
    pub owner: Option<[u8; 32]>,
    /// The cortex session its waits are armed in, made at its first call.
    pub session: Option<String>,
}

/// One task: a wait as an MCP task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct McpTask {
    /// SHA-256 of the caller's token: only it sees the task.
    pub owner: [u8; 32],
    pub session: String,
    pub waitpoint: String,
    /// The tool that made it (`wait_for`, `device_wait_pid`, …).
    pub tool: String,
    pub created_at: u64,
    /// The session's log seq when it was made: the wake it waits for comes after.
    pub after: u64,
    /// The TTL the client asked for, if any.
    pub ttl_ms: Option<u64>,
    /// The task was cancelled (its waitpoint too, when it was still armed).
    pub cancelled_at: Option<u64>,
}

/// An MCP token: a bearer that reaches only `/mcp`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct McpToken {
    pub hash: [u8; 32],
    pub created_at: u64,
}

/// Why a connection's session is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConnectionRefused {
    /// The connection was opened with another token.
    OtherOwner,
}

/// A key for a connection's id, as stored.
pub fn connection_key(id: &str) -> String {
    secret::hex(&secret::hash(id))
}

impl Tx<'_> {
    pub fn mcp_connection(&self, key: &str) -> Result<Option<McpConnection>, StoreError> {
        match self.table(&MCP_CONNECTIONS).get(key)? {
            Some(v) => Ok(Some(decode(v.value())?)),
            None => Ok(None),
        }
    }

    pub fn put_mcp_connection(&mut self, key: &str, c: &McpConnection) -> Result<(), StoreError> {
        self.table_mut(&MCP_CONNECTIONS)
            .insert(key, encode(c)?.as_slice())?;
        Ok(())
    }

    pub fn remove_mcp_connection(&mut self, key: &str) -> Result<(), StoreError> {
        self.table_mut(&MCP_CONNECTIONS).remove(key)?;
        Ok(())
    }

    /// The session of connection `key` for a call carrying the token whose hash is
    /// `owner`: made (a mailbox titled `title`) at the connection's first call, with
    /// the connection itself when it has no record (one without a handshake).
    pub fn mcp_session(
        &mut self,
        key: &str,
        owner: [u8; 32],
        title: &str,
        now: u64,
    ) -> Result<Result<String, ConnectionRefused>, StoreError> {
        let mut c = self.mcp_connection(key)?.unwrap_or(McpConnection {
            init: String::new(),
            created_at: now,
            used_at: now,
            owner: None,
            session: None,
        });
        match c.owner {
            Some(o) if !secret::same_hash(&o, &owner) => {
                return Ok(Err(ConnectionRefused::OtherOwner));
            }
            _ => c.owner = Some(owner),
        }
        let live = match &c.session {
            Some(sid) => self.get_session(sid)?.is_some(),
            None => false,
        };
        if !live {
            let view = self.create_session(Some(title.to_string()), now)?;
            self.put_agent(&view.id, &AgentRecord::mailbox())?;
            c.session = Some(view.id);
        }
        c.used_at = now;
        self.put_mcp_connection(key, &c)?;
        Ok(Ok(c.session.clone().unwrap_or_default()))
    }

    /// Writes a new task under a fresh random id, unless its owner holds the most it may.
    pub fn create_mcp_task(&mut self, task: &McpTask) -> Result<Option<String>, StoreError> {
        if self.mcp_tasks_of(&task.owner)?.len() >= MAX_TASKS_PER_OWNER {
            return Ok(None);
        }
        let mut id = format!("task_{}", secret::random_hex(16));
        while self.table(&MCP_TASKS).get(id.as_str())?.is_some() {
            id = format!("task_{}", secret::random_hex(16));
        }
        self.put_mcp_task(&id, task)?;
        Ok(Some(id))
    }

    pub fn put_mcp_task(&mut self, id: &str, task: &McpTask) -> Result<(), StoreError> {
        self.table_mut(&MCP_TASKS)
            .insert(id, encode(task)?.as_slice())?;
        Ok(())
    }

    /// Task `id` if the token whose hash is `owner` made it.
    pub fn mcp_task(&self, id: &str, owner: &[u8; 32]) -> Result<Option<McpTask>, StoreError> {
        match self.table(&MCP_TASKS).get(id)? {
            Some(v) => {
                let t: McpTask = decode(v.value())?;
                Ok(secret::same_hash(&t.owner, owner).then_some(t))
            }
            None => Ok(None),
        }
    }

    /// The tasks of `owner`, oldest first.
    pub fn mcp_tasks_of(&self, owner: &[u8; 32]) -> Result<Vec<(String, McpTask)>, StoreError> {
        let mut out = Vec::new();
        for r in self.table(&MCP_TASKS).iter()? {
            let (k, v) = r?;
            let t: McpTask = decode(v.value())?;
            if secret::same_hash(&t.owner, owner) {
                out.push((k.value().to_string(), t));
            }
        }
        out.sort_by(|a, b| a.1.created_at.cmp(&b.1.created_at).then(a.0.cmp(&b.0)));
        Ok(out)
    }

    /// Adds MCP token `name` (its hash); false when one of that name exists.
    pub fn add_mcp_token(
        &mut self,
        name: &str,
        hash: [u8; 32],
        now: u64,
    ) -> Result<bool, StoreError> {
        if self.table(&MCP_TOKENS).get(name)?.is_some() {
            return Ok(false);
        }
        let t = McpToken {
            hash,
            created_at: now,
        };
        self.table_mut(&MCP_TOKENS)
            .insert(name, encode(&t)?.as_slice())?;
        Ok(true)
    }

    /// Revokes MCP token `name`; false when there is none.
    pub fn revoke_mcp_token(&mut self, name: &str) -> Result<bool, StoreError> {
        if self.table(&MCP_TOKENS).get(name)?.is_none() {
            return Ok(false);
        }
        self.table_mut(&MCP_TOKENS).remove(name)?;
        Ok(true)
    }

    /// The MCP tokens, by name.
    pub fn mcp_tokens(&self) -> Result<Vec<(String, McpToken)>, StoreError> {
        let mut out = Vec::new();
        for r in self.table(&MCP_TOKENS).iter()? {
            let (k, v) = r?;
            out.push((k.value().to_string(), decode(v.value())?));
        }
        Ok(out)
    }

    /// The name of the MCP token whose hash is `hash`, compared in constant time.
    pub fn mcp_token_named(&self, hash: &[u8; 32]) -> Result<Option<String>, StoreError> {
        let mut found = None;
        for (name, t) in self.mcp_tokens()? {
            if secret::same_hash(&t.hash, hash) {
                found = Some(name);
            }
        }
        Ok(found)
    }

    /// Forgets connections unused and tasks made longer ago than they are kept.
    pub fn forget_old_mcp(&mut self, now: u64) -> Result<usize, StoreError> {
        let mut old_c = Vec::new();
        for r in self.table(&MCP_CONNECTIONS).iter()? {
            let (k, v) = r?;
            let c: McpConnection = decode(v.value())?;
            if c.used_at.saturating_add(CONNECTION_KEPT_MS) < now {
                old_c.push(k.value().to_string());
            }
        }
        let mut old_t = Vec::new();
        for r in self.table(&MCP_TASKS).iter()? {
            let (k, v) = r?;
            let t: McpTask = decode(v.value())?;
            if t.created_at.saturating_add(TASK_KEPT_MS) < now {
                old_t.push(k.value().to_string());
            }
        }
        for k in &old_c {
            self.table_mut(&MCP_CONNECTIONS).remove(k.as_str())?;
        }
        for k in &old_t {
            self.table_mut(&MCP_TASKS).remove(k.as_str())?;
        }
        Ok(old_c.len() + old_t.len())
    }
}
