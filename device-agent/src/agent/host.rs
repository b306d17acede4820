//! What the hello tells the hub about this host: hostname and kernel (uname), CPUs, and GPU
//! names where `nvidia-smi` or `/proc/driver/nvidia` tells. Gathered once at start.
//!
//! Nothing here may hold the agent up: `nvidia-smi` runs under a timeout and is killed when
//! it passes (a wedged driver can hang it for minutes), and every source that fails just
//! leaves its field empty.

use std::path::Path;
use std::time::Duration;

use cortex_protocol::mesh::HostFacts;

/// `nvidia-smi` gets this long; it can take a second or two when the driver is cold.
const NVIDIA_SMI_TIMEOUT: Duration = Duration::from_secs(5);

/// The host's facts. Never fails; unknown fields stay empty.
pub async fn gather() -> HostFacts {
    let uname = rustix::system::uname();
    let hostname = uname.nodename().to_string_lossy().into_owned();
    let kernel = uname.release().to_string_lossy().into_owned();
    let cpus = std::thread::available_parallelism()
        .map(|n| u32::try_from(n.get()).unwrap_or(u32::MAX))
        .unwrap_or(0);
    let mut gpus = nvidia_smi().await;
    if gpus.is_empty() {
        gpus = proc_driver_nvidia(Path::new("/proc/driver/nvidia/gpus"));
    }
    HostFacts {
        hostname,
        kernel,
        cpus,
        gpus,
    }
}

/// `nvidia-smi --query-gpu=name --format=csv,noheader`: one name per line.
async fn nvidia_smi() -> Vec<String> {
    let child = tokio::process::Command::new("nvidia-smi")
        .args(["--query-gpu=name", "--format=csv,noheader"])
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    match tokio::time::timeout(NVIDIA_SMI_TIMEOUT, child).await {
        Ok(Ok(out)) if out.status.success() => parse_smi(&String::from_utf8_lossy(&out.stdout)),
        Ok(Ok(out)) => {
            tracing::debug!(status = %out.status, "nvidia-smi failed; trying /proc/driver/nvidia");
            Vec::new()
        }
        // Not installed: the common case on a box without an NVIDIA GPU.
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Ok(Err(e)) => {
            tracing::debug!(error = %e, "cannot run nvidia-smi");
            Vec::new()
        }
        Err(_) => {
            tracing::warn!(
                "nvidia-smi did not answer within {NVIDIA_SMI_TIMEOUT:?}; GPU names are read from /proc/driver/nvidia instead"
            );
            Vec::new()
        }
    }
}

pub(crate) fn parse_smi(out: &str) -> Vec<String> {
    out.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect()
}

/// `/proc/driver/nvidia/gpus/<bus id>/information`, the `Model:` line of each, in bus order.
pub(crate) fn proc_driver_nvidia(dir: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut dirs: Vec<_> = entries.filter_map(Result::ok).map(|e| e.path()).collect();
    dirs.sort();
    dirs.iter()
        .filter_map(|d| std::fs::read_to_string(d.join("information")).ok())
        .filter_map(|text| parse_information(&text))
        .collect()
}

/// The `Model:` value of one `information` file.
pub(crate) fn parse_information(text: &str) -> Option<String> {
    text.lines().find_map(|line| {
        let (key, value) = line.split_once(':')?;
        (key.trim() == "Model")
            .then(|| value.trim().to_owned())
            .filter(|v| !v.is_empty())
    })
}
