//! The operations of devices, their remote waits and their spool files.

use cortex_protocol::api::{
    CreateDevice, CreateDeviceWait, DeviceCreated, DeviceFiles, DeviceRemoved, DeviceRevoked,
    DeviceView, DeviceWaitCreated,
};
use serde_json::json;
use utoipa::openapi::HttpMethod;

use super::doc::*;
use super::examples::*;

pub(super) fn devices(d: &mut Doc) {
    let name = || path_param("name", "The device's name", "gpu1");

    let body = d.body::<CreateDevice>(true, json!({"name": "gpu1"}));
    let created = d.json::<DeviceCreated>(
        "Enrolled. The only answer that ever shows the device's token",
        json!({"name": "gpu1",
               "token": "934e03a16962c32541a8bed8572958298e293ef58b985fa50f57d40dc233ab2d",
               "install": "cortex-device-agent --hub ws://127.0.0.1:3002/mesh/v1 --name gpu1 --token-file ~/.cortex/device-token"}),
    );
    let bad = d.error(
        "Not such JSON, or a name that is not 1-64 letters, digits, '.', '_' or '-' (not \
         starting with '.' or '-')",
        &["bad_request"],
    );
    let exists = d.error(
        "A device of that name exists; revoke it first to give it a new token",
        &["device_exists"],
    );
    let large = d.error("A name over 64 characters", &["too_large"]);
    d.add(
        HttpMethod::Post,
        "/api/devices",
        Access::Operator,
        op(
            "devices",
            "createDevice",
            "Enrol a device",
            "A token for the device's agent (`cortex-device-agent`), and the line that starts it.",
        )
        .request_body(Some(body.build()))
        .response("201", created)
        .response("400", bad)
        .response("409", exists)
        .response("413", large),
    );

    let list = d.json_list::<DeviceView>("Every device", json!([device_example(false)]));
    d.add(
        HttpMethod::Get,
        "/api/devices",
        Access::Operator,
        op(
            "devices",
            "listDevices",
            "List the devices",
            "Each device's state (a live link is `online`), host, spool counts and number of \
             remote waits.",
        )
        .response("200", list),
    );

    let one = d.json::<DeviceView>(
        "The device, with `wait_list`: its remote waits one by one",
        device_example(true),
    );
    let missing = d.error("No such device", &["not_found"]);
    d.add(
        HttpMethod::Get,
        "/api/devices/{name}",
        Access::Operator,
        op(
            "devices",
            "getDevice",
            "One device",
            "One device and its remote waits.",
        )
        .parameter(name())
        .response("200", one)
        .response("404", missing),
    );

    let revoked = d.json::<DeviceRevoked>(
        "Revoked: its token no longer connects; `dropped_link` says whether a live link ended",
        json!({"name": "gpu1", "revoked": true, "dropped_link": true}),
    );
    let missing = d.error("No such device", &["not_found"]);
    let again = d.error(
        "Revoked already: nothing changed (the message says when, and how to remove it from \
         the list)",
        &["already_revoked"],
    );
    d.add(
        HttpMethod::Delete,
        "/api/devices/{name}",
        Access::Operator,
        op(
            "devices",
            "revokeDevice",
            "Revoke a device",
            "Deletes its token and ends its live link at once.",
        )
        .parameter(name())
        .response("200", revoked)
        .response("404", missing)
        .response("409", again),
    );

    let removed = d.json::<DeviceRemoved>(
        "Removed: the revoked device is no longer listed",
        json!({"name": "gpu1", "removed": true}),
    );
    let missing = d.error("No revoked device of that name", &["not_found"]);
    let enrolled = d.error(
        "The device is enrolled, not revoked: revoke it first",
        &["not_revoked"],
    );
    d.add(
        HttpMethod::Delete,
        "/api/devices/{name}/revoked",
        Access::Operator,
        op(
            "devices",
            "removeDevice",
            "Remove a revoked device from the list",
            "A revoked device stays listed (state `revoked`) until its name is added again or \
             it is removed here. Only a revoked one: this never cuts an enrolled device off.",
        )
        .parameter(name())
        .response("200", removed)
        .response("404", missing)
        .response("409", enrolled),
    );

    let body = d.body::<CreateDeviceWait>(
        true,
        json!({"kind": "pid", "pid": 4242, "timeout_s": 86400,
               "session": "ses_f34c0a6e83ea"}),
    );
    let mut created = waitpoint_created_example();
    created["id"] = json!("wp_dceb9dffaceb");
    created["label"] = json!("pid 4242 on gpu1");
    created["intent"] = json!("wake when process 4242 on gpu1 exits");
    created["device"] = json!("gpu1");
    created["how_to_signal"] = how_to_signal_example("wp_dceb9dffaceb", "shell");
    created["wait"] = device_wait_example();
    let created = d.json::<DeviceWaitCreated>(
        "A waitpoint bound to the device (as its creation answers, the secret this once) and \
         the wait; the device's agent signals it when the condition holds",
        created,
    );
    let bad = d.error(
        "Not such JSON, or a condition that is not usable (a relative path, a pattern that \
         does not compile, …)",
        &["bad_request", "invalid_wait", "invalid_waitpoint"],
    );
    let missing = d.error("No such device, or no such `session`", &["not_found"]);
    let conflict = d.error(
        "The device's online agent does not run that kind of wait, or it holds the most \
         remote waits it may",
        &["unsupported_wait", "too_many_waits"],
    );
    let large = d.error("A field over its cap", &["too_large"]);
    d.add(
        HttpMethod::Post,
        "/api/devices/{name}/waits",
        Access::Operator,
        op(
            "devices",
            "createDeviceWait",
            "Arm a remote wait on a device",
            "A pid exiting (`pid`, with `start_time` to pin the process), a file written \
             (`file`), a lock coming free (`flock`), a log line matching (`log`, `path` and \
             `match`), a file quiet for `silence` (on `file` and `log`), or the first of \
             several (`any`, `conditions`). The wake goes to `session`, or to a session \
             created for it. An offline device gets the wait when its agent connects.",
        )
        .parameter(name())
        .request_body(Some(body.build()))
        .response("201", created)
        .response("400", bad)
        .response("404", missing)
        .response("409", conflict)
        .response("413", large),
    );

    let files = d.json::<DeviceFiles>(
        "The device's latest spool files (at most 100, newest first, since the hub started) \
         and what the hub answered each",
        json!({"files": [{"at": 1796166171000_u64, "name": "1796166170-4242-1.json",
                          "outcome": "accepted"}]}),
    );
    let missing = d.error("No such device", &["not_found"]);
    d.add(
        HttpMethod::Get,
        "/api/devices/{name}/files",
        Access::Operator,
        op(
            "devices",
            "listDeviceFiles",
            "A device's latest spool files",
            "A refused file is one the agent parked under `bad/`, with the reason it was given.",
        )
        .parameter(name())
        .response("200", files)
        .response("404", missing),
    );
}
