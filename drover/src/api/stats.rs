//! Resource usage as the client endpoints answer it (Nomad's
//! `api/allocations.go` `AllocResourceUsage` and `api/nodes.go`
//! `HostStats`): complete objects, since Nomad's CLI reads their fields
//! without checking for `null`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use transport::message::{AllocUsage, HostStats as AgentHostStats, ProcessUsage};

/// What the measurements read: Nomad's `Measured` lists.
const MEMORY_MEASURED: [&str; 2] = ["RSS", "Swap"];
const CPU_MEASURED: [&str; 3] = ["System Mode", "User Mode", "Percent"];

/// `GET /v1/client/allocation/:id/stats` (`AllocResourceUsage`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct AllocResourceUsage {
    /// Every running task's together.
    pub resource_usage: ResourceUsage,
    /// By task.
    pub tasks: BTreeMap<String, TaskResourceUsage>,
    /// When it was read, in Unix nanoseconds.
    pub timestamp: i64,
}

/// One task's usage (`TaskResourceUsage`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct TaskResourceUsage {
    /// Its processes' together.
    pub resource_usage: ResourceUsage,
    /// When it was read, in Unix nanoseconds.
    pub timestamp: i64,
    /// By process: `null` (its processes are counted together).
    pub pids: Option<BTreeMap<String, ResourceUsage>>,
}

/// Memory and CPU (`ResourceUsage`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct ResourceUsage {
    /// Memory.
    pub memory_stats: MemoryStats,
    /// CPU.
    pub cpu_stats: CpuStats,
    /// Devices: none.
    pub device_stats: Vec<serde_json::Value>,
}

/// Memory, bytes (`MemoryStats`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
#[allow(missing_docs)]
pub struct MemoryStats {
    #[serde(rename = "RSS")]
    pub rss: u64,
    pub cache: u64,
    pub swap: u64,
    pub usage: u64,
    pub max_usage: u64,
    pub kernel_usage: u64,
    pub kernel_max_usage: u64,
    /// Which of the above were measured.
    pub measured: Vec<String>,
}

/// CPU, percent of one core and MHz (`CpuStats`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
#[allow(missing_docs)]
pub struct CpuStats {
    pub system_mode: f64,
    pub user_mode: f64,
    pub total_ticks: f64,
    pub throttled_periods: u64,
    pub throttled_time: u64,
    pub percent: f64,
    /// Which of the above were measured.
    pub measured: Vec<String>,
}

impl From<&ProcessUsage> for ResourceUsage {
    fn from(usage: &ProcessUsage) -> Self {
        ResourceUsage {
            memory_stats: MemoryStats {
                rss: usage.rss_bytes,
                swap: usage.swap_bytes,
                usage: usage.rss_bytes + usage.swap_bytes,
                measured: MEMORY_MEASURED.iter().map(|name| name.to_string()).collect(),
                ..MemoryStats::default()
            },
            cpu_stats: CpuStats {
                system_mode: usage.system_percent,
                user_mode: usage.user_percent,
                total_ticks: usage.total_ticks,
                percent: usage.percent,
                measured: CPU_MEASURED.iter().map(|name| name.to_string()).collect(),
                ..CpuStats::default()
            },
            device_stats: Vec::new(),
        }
    }
}

impl From<&AllocUsage> for AllocResourceUsage {
    fn from(usage: &AllocUsage) -> Self {
        let mut total = ProcessUsage::default();
        for task in usage.tasks.values() {
            total.rss_bytes += task.rss_bytes;
            total.swap_bytes += task.swap_bytes;
            total.user_percent += task.user_percent;
            total.system_percent += task.system_percent;
            total.percent += task.percent;
            total.total_ticks += task.total_ticks;
        }
        let tasks = usage
            .tasks
            .iter()
            .map(|(name, task)| {
                let task = TaskResourceUsage {
                    resource_usage: ResourceUsage::from(task),
                    timestamp: usage.timestamp,
                    pids: None,
                };
                (name.clone(), task)
            })
            .collect();
        AllocResourceUsage { resource_usage: ResourceUsage::from(&total), tasks, timestamp: usage.timestamp }
    }
}

/// `GET /v1/client/stats` (`HostStats`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct HostStats {
    /// Memory.
    pub memory: HostMemoryStats,
    /// Each core.
    #[serde(rename = "CPU")]
    pub cpu: Vec<HostCpuStats>,
    /// The file system of the agent's data dir.
    pub disk_stats: Vec<HostDiskStats>,
    /// The same, where allocations live.
    pub alloc_dir_stats: HostDiskStats,
    /// Devices: none.
    pub device_stats: Vec<serde_json::Value>,
    /// Seconds since boot.
    pub uptime: u64,
    /// When it was read, in Unix nanoseconds.
    pub timestamp: i64,
    /// CPU used, MHz.
    #[serde(rename = "CPUTicksConsumed")]
    pub cpu_ticks_consumed: f64,
}

/// Memory, bytes (`HostMemoryStats`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
#[allow(missing_docs)]
pub struct HostMemoryStats {
    pub total: u64,
    pub available: u64,
    pub used: u64,
    pub free: u64,
}

/// One core, percent (`HostCPUStats`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
#[allow(missing_docs)]
pub struct HostCpuStats {
    #[serde(rename = "CPU")]
    pub cpu: String,
    pub user: f64,
    pub system: f64,
    pub idle: f64,
}

/// A file system (`HostDiskStats`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
#[allow(missing_docs)]
pub struct HostDiskStats {
    pub device: String,
    pub mountpoint: String,
    pub size: u64,
    pub used: u64,
    pub available: u64,
    pub used_percent: f64,
    pub inodes_used_percent: f64,
}

impl From<&AgentHostStats> for HostStats {
    fn from(stats: &AgentHostStats) -> Self {
        let disks: Vec<HostDiskStats> = stats
            .disks
            .iter()
            .map(|disk| HostDiskStats {
                device: disk.device.clone(),
                mountpoint: disk.mountpoint.clone(),
                size: disk.size,
                used: disk.used,
                available: disk.available,
                used_percent: disk.used_percent,
                inodes_used_percent: disk.inodes_used_percent,
            })
            .collect();
        HostStats {
            memory: HostMemoryStats {
                total: stats.memory_total,
                available: stats.memory_available,
                used: stats.memory_used,
                free: stats.memory_free,
            },
            cpu: stats
                .cpus
                .iter()
                .map(|cpu| HostCpuStats { cpu: cpu.cpu.clone(), user: cpu.user, system: cpu.system, idle: cpu.idle })
                .collect(),
            alloc_dir_stats: disks.first().cloned().unwrap_or_default(),
            disk_stats: disks,
            device_stats: Vec::new(),
            uptime: stats.uptime,
            timestamp: stats.timestamp,
            cpu_ticks_consumed: stats.cpu_ticks_consumed,
        }
    }
}
