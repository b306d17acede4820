//! The store's schema on PostgreSQL, version by version ([`MIGRATIONS`], applied by
//! `kernel::pg::migrate`). A table added to `tables::REGISTRY` needs a migration that
//! creates it: the store refuses to open on PostgreSQL otherwise, and says which table.

use super::kernel::pg::migrate::{Migration, Step};

pub(crate) static MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        what: "the store's tables",
        steps: &[Step::Tables(&[
            "meta",
            "timer_queue",
            "waitpoints_v2",
            "signal_keys",
            "deadlines",
            "sessions",
            "session_waitpoints",
            "events",
            "message_keys",
            "devices",
            "hub_events",
            "device_waits",
            "timers",
            "device_wait_due",
            "agents",
            "transcript",
            "ready",
            "pending",
            "revoked_devices",
            "wait_consumers",
            "notices",
            "notice_keys",
        ])],
    },
    Migration {
        version: 2,
        what: "what the hubs on the database share (the operator token's hash)",
        steps: &[Step::Tables(&["hub_secrets"])],
    },
    Migration {
        version: 3,
        what: "several hubs on the database: the batches log and the sessions' claims",
        steps: &[
            Step::Sql(
                "CREATE TABLE cortex.batches (
                     n bigserial PRIMARY KEY,
                     writer bigint NOT NULL,
                     notices bytea NOT NULL,
                     at timestamptz NOT NULL DEFAULT now()
                 )",
            ),
            Step::Tables(&["session_claims"]),
        ],
    },
    Migration {
        version: 4,
        what: "when each hub last said it is alive",
        steps: &[Step::Tables(&["hub_beats"])],
    },
    Migration {
        version: 5,
        what: "commands asked of the hub holding a device's link",
        steps: &[Step::Tables(&["exec_asks"])],
    },
    Migration {
        version: 6,
        what: "MCP connections and tasks",
        steps: &[Step::Tables(&["mcp_connections", "mcp_tasks"])],
    },
    Migration {
        version: 7,
        what: "MCP tokens",
        steps: &[Step::Tables(&["mcp_tokens"])],
    },
];
