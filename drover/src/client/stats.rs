//! Resource usage as the agent reads it from the host (`/proc`,
//! `statvfs`), for the servers' `/v1/client/allocation/:id/stats` and
//! `/v1/client/stats`.
//!
//! A task's usage is its process group's (the task's process and what it
//! started): resident and swapped memory now, and CPU time as a share of
//! one core since the task started (Nomad samples over its collection
//! interval; an agent that keeps no samples reports the average since
//! start). The host's CPU shares are since boot, for the same reason.

use std::collections::BTreeMap;
use std::path::Path;

use transport::message::{CpuUsage, DiskUsage, HostStats, ProcessUsage};

use crate::client::clock::now;
use crate::client::drivers::executor::stat_fields;

/// What one core of the host is worth in MHz (the node's fingerprint),
/// to turn shares of a core into Nomad's ticks.
#[derive(Clone, Copy, Debug)]
pub struct CpuScale {
    /// MHz of one core.
    pub mhz_per_core: f64,
}

/// What the processes of the group `group` (a task's) use now; `None`
/// when none runs.
pub fn group_usage(group: i32, scale: CpuScale) -> Option<ProcessUsage> {
    let ticks = rustix::param::clock_ticks_per_second() as f64;
    let page = rustix::param::page_size() as u64;
    let uptime = uptime_seconds()?;
    let mut usage = ProcessUsage::default();
    let (mut user, mut system, mut started) = (0.0, 0.0, f64::MAX);
    for pid in pids() {
        let Some(fields) = rustix::process::Pid::from_raw(pid).and_then(stat_fields) else { continue };
        // After the name: [0] state, [2] pgrp, [11] utime, [12] stime,
        // [19] starttime, [21] rss (pages).
        if fields.get(2).and_then(|pgrp| pgrp.parse::<i32>().ok()) != Some(group) {
            continue;
        }
        let field = |index: usize| fields.get(index).and_then(|value| value.parse::<f64>().ok()).unwrap_or(0.0);
        user += field(11) / ticks;
        system += field(12) / ticks;
        started = started.min(field(19) / ticks);
        usage.rss_bytes += field(21) as u64 * page;
        usage.swap_bytes += swap_bytes(pid);
        usage.pids += 1;
    }
    if usage.pids == 0 {
        return None;
    }
    let elapsed = (uptime - started).max(1.0 / ticks);
    usage.user_percent = 100.0 * user / elapsed;
    usage.system_percent = 100.0 * system / elapsed;
    usage.percent = usage.user_percent + usage.system_percent;
    usage.total_ticks = usage.percent / 100.0 * scale.mhz_per_core;
    Some(usage)
}

/// Every pid in `/proc`.
fn pids() -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    entries.filter_map(|entry| entry.ok()?.file_name().to_str()?.parse().ok()).collect()
}

/// `VmSwap` of `/proc/<pid>/status`, bytes.
fn swap_bytes(pid: i32) -> u64 {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else { return 0 };
    kib_field(&status, "VmSwap:").unwrap_or(0) * 1024
}

/// The KiB value of `name` in a `/proc` file of `Name: value kB` lines.
fn kib_field(text: &str, name: &str) -> Option<u64> {
    let line = text.lines().find(|line| line.starts_with(name))?;
    line[name.len()..].split_whitespace().next()?.parse().ok()
}

/// Seconds since boot.
fn uptime_seconds() -> Option<f64> {
    std::fs::read_to_string("/proc/uptime").ok()?.split_whitespace().next()?.parse().ok()
}

/// The host's memory, CPU and the data dir's file system now.
pub fn host_stats(data_dir: &Path, scale: CpuScale) -> HostStats {
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let kib = |name: &str| kib_field(&meminfo, name).unwrap_or(0) * 1024;
    let (total, available, free) = (kib("MemTotal:"), kib("MemAvailable:"), kib("MemFree:"));
    let cpus = cpu_usage(&std::fs::read_to_string("/proc/stat").unwrap_or_default());
    let busy: f64 = cpus.iter().map(|cpu| 100.0 - cpu.idle).sum::<f64>() / 100.0;
    HostStats {
        memory_total: total,
        memory_available: available,
        memory_used: total.saturating_sub(available),
        memory_free: free,
        cpu_ticks_consumed: busy * scale.mhz_per_core,
        cpus,
        disks: disk_usage(data_dir).into_iter().collect(),
        uptime: uptime_seconds().unwrap_or(0.0) as u64,
        timestamp: i64::try_from(now().0).unwrap_or(i64::MAX),
    }
}

/// Each core's shares of time since boot, from `/proc/stat`'s `cpuN` lines
/// (user and nice are user time; system, irq and softirq the kernel's;
/// idle and iowait idle).
pub fn cpu_usage(proc_stat: &str) -> Vec<CpuUsage> {
    let mut cpus = Vec::new();
    for line in proc_stat.lines() {
        let mut parts = line.split_whitespace();
        let Some(name) = parts.next().filter(|name| name.starts_with("cpu") && name.len() > 3) else { continue };
        let values: Vec<f64> = parts.filter_map(|value| value.parse().ok()).collect();
        let value = |index: usize| values.get(index).copied().unwrap_or(0.0);
        let total: f64 = values.iter().take(8).sum();
        if total <= 0.0 {
            continue;
        }
        let share = |ticks: f64| 100.0 * ticks / total;
        cpus.push(CpuUsage {
            cpu: name.to_string(),
            user: share(value(0) + value(1)),
            system: share(value(2) + value(5) + value(6)),
            idle: share(value(3) + value(4)),
        });
    }
    cpus
}

/// The file system `dir` is on.
fn disk_usage(dir: &Path) -> Option<DiskUsage> {
    let stat = rustix::fs::statvfs(dir).ok()?;
    let block = stat.f_frsize.max(1);
    let size = stat.f_blocks * block;
    let available = stat.f_bavail * block;
    let used = size.saturating_sub(stat.f_bfree * block);
    let percent = |part: u64, whole: u64| if whole == 0 { 0.0 } else { 100.0 * part as f64 / whole as f64 };
    let (device, mountpoint) = mount_of(dir).unwrap_or_default();
    Some(DiskUsage {
        device,
        mountpoint,
        size,
        used,
        available,
        used_percent: percent(used, used + available),
        inodes_used_percent: percent(stat.f_files.saturating_sub(stat.f_ffree), stat.f_files),
    })
}

/// The device and mount point of the mount `dir` is under (the longest
/// mount point that is a prefix of it), from `/proc/mounts`.
fn mount_of(dir: &Path) -> Option<(String, String)> {
    let mounts = std::fs::read_to_string("/proc/mounts").ok()?;
    let mut found: BTreeMap<usize, (String, String)> = BTreeMap::new();
    for line in mounts.lines() {
        let mut parts = line.split_whitespace();
        let (Some(device), Some(point)) = (parts.next(), parts.next()) else { continue };
        if dir.starts_with(point) {
            found.insert(point.len(), (device.to_string(), point.to_string()));
        }
    }
    found.pop_last().map(|(_, mount)| mount)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn core_shares_come_from_proc_stat() {
        let text = "cpu  10 0 10 80 0 0 0 0 0 0\ncpu0 30 10 10 40 10 0 0 0 0 0\nintr 1 2 3\n";
        let cpus = cpu_usage(text);
        assert_eq!(cpus.len(), 1, "the total line is not a core");
        assert_eq!((cpus[0].cpu.as_str(), cpus[0].user, cpus[0].system, cpus[0].idle), ("cpu0", 40.0, 10.0, 50.0));
    }

    #[test]
    fn this_process_group_and_the_host_are_measured() {
        let scale = CpuScale { mhz_per_core: 2_000.0 };
        let group = rustix::process::getpgrp().as_raw_nonzero().get();
        let usage = group_usage(group, scale).expect("this test runs in a group");
        assert!(usage.pids >= 1 && usage.rss_bytes > 0, "{usage:?}");
        let host = host_stats(&std::env::temp_dir(), scale);
        assert!(host.memory_total > 0 && host.memory_used <= host.memory_total, "{host:?}");
        assert!(!host.cpus.is_empty() && host.uptime > 0, "{host:?}");
        assert_eq!(host.disks.len(), 1, "the temp dir's file system");
        assert!(host.disks[0].size > 0);
    }
}
