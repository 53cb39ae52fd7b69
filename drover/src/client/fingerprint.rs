//! Fingerprinting (Nomad's `client/fingerprint`): what this host is, read
//! from the host, never assumed. The node's address, CPU, memory, operating
//! system, kernel and the data dir's file system become the node's
//! attributes under Nomad's names (`cpu.arch`, `kernel.version`,
//! `unique.network.ip-address`, ...) and, unless the operator configures
//! them, its resources.
//!
//! Contract:
//! - Parsing is pure: functions over the text of the files the kernel and the
//!   distribution publish (`/proc/cpuinfo`, `/proc/meminfo`,
//!   `/proc/net/route`, `/proc/net/ipv6_route`, `/proc/self/mountinfo`,
//!   `/etc/os-release`) and over the host's interface addresses, so each is
//!   tested on sample text. [`Fingerprint::of_host`] is the thin part that
//!   reads the real host.
//! - The node's address is, in order: the first IPv4 address of the
//!   configured `network_interface` (its first IPv6 one if it has none; an
//!   interface that does not exist or has no address is an error), else
//!   that of the interface of the default route, else the address this host
//!   reaches its first server from (a connected UDP socket's local address:
//!   no packet is sent).
//! - A fact the host does not publish is left out (its attribute missing),
//!   never made up; the agent logs what it could not read.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};

/// The Nomad version this agent advertises as `nomad.version` (the node
/// list's `Version`). Nomad's CLI and API clients read it as a semantic
/// version and gate features on it (disconnect handling and the
/// `disconnect` block came in 1.3 and 1.8), so it must parse as one, and
/// it names the Nomad whose behaviour Drover follows: its `disconnect`
/// block is 1.8's (`docs/node-lifecycle.md`).
pub const NOMAD_VERSION: &str = "1.8.0";

/// Why the host could not be fingerprinted as configured.
#[derive(Debug, thiserror::Error)]
pub enum FingerprintError {
    /// The configured `network_interface` is not on this host.
    #[error("client.network_interface: no interface {0:?} on this host (it has: {1})")]
    NoInterface(String, String),
    /// The configured `network_interface` has no IP address.
    #[error("client.network_interface: interface {0:?} has no IP address")]
    NoAddress(String),
    /// No interface, default route or server gave an address.
    #[error("no address for the node: no default route and no server to reach (set client.network_interface)")]
    Unreachable,
    /// The data dir's file system could not be read.
    #[error("statvfs {dir}: {source}")]
    Storage {
        /// The data dir.
        dir: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// One address of one interface of the host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InterfaceAddress {
    /// The interface (`eth0`).
    pub interface: String,
    /// One of its addresses.
    pub ip: IpAddr,
}

/// An address the fingerprint found, with the interface it is on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FoundAddress {
    /// The interface (`""`: not known, the address came from a socket).
    pub device: String,
    /// The address.
    pub ip: IpAddr,
}

/// A client `host_network` as configured: a name, and where to look for
/// its address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostNetworkSpec {
    /// The name ports ask for (`host_network = "public"`).
    pub name: String,
    /// The address is one of the host's in this network.
    pub cidr: Option<Cidr>,
    /// The address is one of this interface's.
    pub interface: Option<String>,
}

/// What the fingerprint is asked to look at.
#[derive(Clone, Debug)]
pub struct FingerprintSettings {
    /// The agent's data dir: the file system whose size is the node's disk.
    pub data_dir: PathBuf,
    /// The interface whose address is the node's (`client.network_interface`).
    pub network_interface: Option<String>,
    /// The first server, whose route gives the address when nothing else does.
    pub server: Option<SocketAddr>,
    /// The named host networks to find.
    pub host_networks: Vec<HostNetworkSpec>,
}

/// What the host is.
#[derive(Clone, Debug, PartialEq)]
pub struct Fingerprint {
    /// Nomad's node attributes, by name.
    pub attributes: BTreeMap<String, String>,
    /// CPU cores this process may run on.
    pub cpu_cores: u64,
    /// Each core's frequency in MHz, when the host publishes it.
    pub cpu_mhz: Option<u64>,
    /// Total memory in bytes, when the host publishes it.
    pub memory_bytes: Option<u64>,
    /// Bytes free for an unprivileged user on the data dir's file system.
    pub disk_free_bytes: u64,
    /// The node's address.
    pub address: FoundAddress,
    /// The host networks found, by name; one not found is missing.
    pub host_networks: BTreeMap<String, FoundAddress>,
}

impl Fingerprint {
    /// The node's CPU in MHz (Nomad's `cpu.totalcompute`): cores × MHz,
    /// when the frequency is known.
    pub fn cpu_total_compute(&self) -> Option<u64> {
        self.cpu_mhz.map(|mhz| mhz * self.cpu_cores)
    }

    /// Reads the real host.
    pub fn of_host(settings: &FingerprintSettings) -> Result<Fingerprint, FingerprintError> {
        let interfaces = interface_addresses();
        let address = node_address(settings, &interfaces)?;
        let host_networks = settings
            .host_networks
            .iter()
            .filter_map(|spec| Some((spec.name.clone(), host_network_address(spec, &interfaces)?)))
            .collect();
        let storage = storage(&settings.data_dir)?;
        let (cpu, cpu_cores, cpu_mhz) = host_cpu();
        let memory_bytes = read("/proc/meminfo").and_then(|text| mem_total_bytes(&text));
        let mut attributes = BTreeMap::from([
            ("cpu.arch".to_string(), go_arch(std::env::consts::ARCH).to_string()),
            ("cpu.numcores".to_string(), cpu_cores.to_string()),
            ("unique.network.ip-address".to_string(), address.ip.to_string()),
            ("unique.storage.bytestotal".to_string(), storage.bytes_total.to_string()),
            ("unique.storage.bytesfree".to_string(), storage.bytes_free.to_string()),
            ("nomad.version".to_string(), NOMAD_VERSION.to_string()),
            ("drover.version".to_string(), env!("CARGO_PKG_VERSION").to_string()),
            ("os.signals".to_string(), SIGNALS.join(",")),
        ]);
        let mounts = read("/proc/self/mountinfo");
        let optional = [
            ("cpu.frequency", cpu_mhz.map(|mhz| mhz.to_string())),
            ("cpu.totalcompute", cpu_mhz.map(|mhz| (mhz * cpu_cores).to_string())),
            ("cpu.modelname", cpu.model_name),
            ("memory.totalbytes", memory_bytes.map(|bytes| bytes.to_string())),
            ("unique.storage.volume", mounts.and_then(|text| mount_source(&text, &settings.data_dir))),
        ];
        for (key, value) in optional.into_iter().chain(system_attributes()) {
            if let Some(value) = value.filter(|value| !value.is_empty()) {
                attributes.insert(key.to_string(), value);
            }
        }
        Ok(Fingerprint {
            attributes,
            cpu_cores,
            cpu_mhz,
            memory_bytes,
            disk_free_bytes: storage.bytes_free,
            address,
            host_networks,
        })
    }
}

/// The first processor's `/proc/cpuinfo`, the usable cores, and the
/// frequency: the maximum cpufreq publishes, else the current one.
fn host_cpu() -> (CpuInfo, u64, Option<u64>) {
    let cpu = read("/proc/cpuinfo").map(|text| cpu_info(&text)).unwrap_or_default();
    let max_khz = read("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq");
    let mhz = max_khz.and_then(|text| mhz_of_khz(&text)).or(cpu.mhz.map(|mhz| mhz.round() as u64));
    (cpu, usable_cores(), mhz)
}

/// The kernel's (`uname`) and the distribution's (`os-release`) attributes.
fn system_attributes() -> [(&'static str, Option<String>); 6] {
    let uname = rustix::system::uname();
    let text = |value: &std::ffi::CStr| Some(value.to_string_lossy().into_owned());
    let os = read("/etc/os-release").or_else(|| read("/usr/lib/os-release")).map(|text| os_release(&text));
    let (os_name, os_version) = os.unwrap_or_default();
    [
        ("kernel.name", text(uname.sysname()).map(|name| name.to_lowercase())),
        ("kernel.version", text(uname.release())),
        ("kernel.arch", text(uname.machine())),
        ("unique.hostname", text(uname.nodename())),
        ("os.name", os_name),
        ("os.version", os_version),
    ]
}

/// Nomad's `os.signals` on Linux: the signals a task may be sent.
const SIGNALS: [&str; 31] = [
    "SIGABRT",
    "SIGALRM",
    "SIGBUS",
    "SIGCHLD",
    "SIGCONT",
    "SIGFPE",
    "SIGHUP",
    "SIGILL",
    "SIGINT",
    "SIGIO",
    "SIGIOT",
    "SIGKILL",
    "SIGPIPE",
    "SIGPROF",
    "SIGPWR",
    "SIGQUIT",
    "SIGSEGV",
    "SIGSTKFLT",
    "SIGSTOP",
    "SIGSYS",
    "SIGTERM",
    "SIGTRAP",
    "SIGTSTP",
    "SIGTTIN",
    "SIGTTOU",
    "SIGURG",
    "SIGUSR1",
    "SIGUSR2",
    "SIGVTALRM",
    "SIGWINCH",
    "SIGXCPU",
];

fn read(path: &str) -> Option<String> {
    std::fs::read_to_string(path).ok()
}

/// The cores this process may run on (its affinity mask, as `nproc` counts).
fn usable_cores() -> u64 {
    match rustix::thread::sched_getaffinity(None) {
        Ok(set) if set.count() > 0 => u64::from(set.count()),
        _ => std::thread::available_parallelism().map_or(1, |cores| cores.get() as u64),
    }
}

/// The data dir's file system: its size and what is free.
#[derive(Clone, Copy, Debug)]
struct Storage {
    bytes_total: u64,
    bytes_free: u64,
}

fn storage(dir: &Path) -> Result<Storage, FingerprintError> {
    let stat = rustix::fs::statvfs(dir)
        .map_err(|error| FingerprintError::Storage { dir: dir.to_path_buf(), source: error.into() })?;
    Ok(Storage {
        bytes_total: stat.f_blocks.saturating_mul(stat.f_frsize),
        bytes_free: stat.f_bavail.saturating_mul(stat.f_frsize),
    })
}

/// Every address of every interface of the host (none if they cannot be read).
pub fn interface_addresses() -> Vec<InterfaceAddress> {
    let Ok(addresses) = nix::ifaddrs::getifaddrs() else { return Vec::new() };
    addresses
        .filter_map(|entry| {
            let address = entry.address?;
            let ip = if let Some(v4) = address.as_sockaddr_in() {
                IpAddr::V4(*std::net::SocketAddrV4::from(*v4).ip())
            } else {
                IpAddr::V6(address.as_sockaddr_in6()?.ip())
            };
            Some(InterfaceAddress { interface: entry.interface_name, ip })
        })
        .collect()
}

/// The node's address (module docs, for the order).
fn node_address(
    settings: &FingerprintSettings,
    interfaces: &[InterfaceAddress],
) -> Result<FoundAddress, FingerprintError> {
    if let Some(name) = &settings.network_interface {
        return configured_interface_address(interfaces, name);
    }
    let route = read("/proc/net/route").and_then(|text| default_route_interface(&text));
    let route = route.or_else(|| read("/proc/net/ipv6_route").and_then(|text| default_route6_interface(&text)));
    if let Some((device, ip)) = route.and_then(|device| Some((device.clone(), pick_address(interfaces, &device)?))) {
        return Ok(FoundAddress { device, ip });
    }
    let server = settings.server.ok_or(FingerprintError::Unreachable)?;
    let ip = source_address_towards(server).ok_or(FingerprintError::Unreachable)?;
    let device = interfaces.iter().find(|found| found.ip == ip).map(|found| found.interface.clone());
    Ok(FoundAddress { device: device.unwrap_or_default(), ip })
}

/// The address of the interface the operator named, or why there is none.
pub fn configured_interface_address(
    interfaces: &[InterfaceAddress],
    name: &str,
) -> Result<FoundAddress, FingerprintError> {
    if !interfaces.iter().any(|found| found.interface == name) {
        let mut names: Vec<&str> = interfaces.iter().map(|found| found.interface.as_str()).collect();
        names.dedup();
        return Err(FingerprintError::NoInterface(name.to_string(), names.join(", ")));
    }
    let ip = pick_address(interfaces, name).ok_or_else(|| FingerprintError::NoAddress(name.to_string()))?;
    Ok(FoundAddress { device: name.to_string(), ip })
}

/// The local address the kernel would send from to reach `server`: a UDP
/// socket connected there (which sends nothing) tells it.
fn source_address_towards(server: SocketAddr) -> Option<IpAddr> {
    let any: SocketAddr = if server.is_ipv4() { ([0, 0, 0, 0], 0).into() } else { ([0u16; 8], 0).into() };
    let socket = std::net::UdpSocket::bind(any).ok()?;
    socket.connect(server).ok()?;
    Some(socket.local_addr().ok()?.ip()).filter(|ip| !ip.is_unspecified())
}

/// The address a host network has here: an address of its interface (in
/// its CIDR, if it has one too), or else the first of the host's in its CIDR.
pub fn host_network_address(spec: &HostNetworkSpec, interfaces: &[InterfaceAddress]) -> Option<FoundAddress> {
    let in_cidr = |found: &&InterfaceAddress| spec.cidr.as_ref().is_none_or(|cidr| cidr.contains(found.ip));
    let on_interface = |found: &&InterfaceAddress| spec.interface.as_ref().is_none_or(|name| &found.interface == name);
    if spec.cidr.is_none() {
        let name = spec.interface.as_ref()?;
        return Some(FoundAddress { device: name.clone(), ip: pick_address(interfaces, name)? });
    }
    let found = interfaces.iter().filter(in_cidr).find(on_interface)?;
    Some(FoundAddress { device: found.interface.clone(), ip: found.ip })
}

/// An interface's address as Nomad picks it: its first IPv4 address, else
/// its first IPv6 one that is not link-local (those need a scope), else any.
pub fn pick_address(interfaces: &[InterfaceAddress], name: &str) -> Option<IpAddr> {
    let of_interface = || interfaces.iter().filter(|found| found.interface == name).map(|found| found.ip);
    let link_local = |ip: &IpAddr| matches!(ip, IpAddr::V6(v6) if (v6.segments()[0] & 0xffc0) == 0xfe80);
    of_interface()
        .find(IpAddr::is_ipv4)
        .or_else(|| of_interface().find(|ip| !link_local(ip)))
        .or_else(|| of_interface().next())
}

/// The interface of the IPv4 default route in `/proc/net/route` (the one
/// with the lowest metric when there are several); `None` without one.
pub fn default_route_interface(route: &str) -> Option<String> {
    const RTF_UP: u32 = 0x1;
    route
        .lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (iface, destination, flags, metric, mask) =
                (fields.first()?, fields.get(1)?, fields.get(3)?, fields.get(6)?, fields.get(7)?);
            let flags = u32::from_str_radix(flags, 16).ok()?;
            let default = *destination == "00000000" && *mask == "00000000" && flags & RTF_UP != 0;
            default.then(|| (metric.parse::<u32>().unwrap_or(u32::MAX), iface.to_string()))
        })
        .min()
        .map(|(_, iface)| iface)
}

/// The interface of the IPv6 default route in `/proc/net/ipv6_route`
/// (lowest metric; the kernel's unreachable default on `lo` is not one).
pub fn default_route6_interface(route: &str) -> Option<String> {
    const RTF_UP: u32 = 0x1;
    route
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (destination, prefix, metric, flags, iface) =
                (fields.first()?, fields.get(1)?, fields.get(5)?, fields.get(8)?, fields.get(9)?);
            let flags = u32::from_str_radix(flags, 16).ok()?;
            let default = destination.bytes().all(|byte| byte == b'0') && *prefix == "00";
            let usable = default && flags & RTF_UP != 0 && *iface != "lo";
            usable.then(|| (u32::from_str_radix(metric, 16).unwrap_or(u32::MAX), iface.to_string()))
        })
        .min()
        .map(|(_, iface)| iface)
}

/// What `/proc/cpuinfo` says of the first processor.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CpuInfo {
    /// `model name` (x86), else `Model` or `cpu model` (other architectures).
    pub model_name: Option<String>,
    /// `cpu MHz`: its current frequency.
    pub mhz: Option<f64>,
}

/// Reads the first processor's model and frequency from `/proc/cpuinfo`.
pub fn cpu_info(text: &str) -> CpuInfo {
    let first = text.split("\n\n").next().unwrap_or("");
    let value = |key: &str| {
        first.lines().find_map(|line| {
            let (name, value) = line.split_once(':')?;
            (name.trim() == key).then(|| value.trim().to_string()).filter(|value| !value.is_empty())
        })
    };
    CpuInfo {
        model_name: value("model name").or_else(|| value("Model")).or_else(|| value("cpu model")),
        mhz: value("cpu MHz").and_then(|mhz| mhz.parse::<f64>().ok()).filter(|mhz| *mhz > 0.0),
    }
}

/// MHz from `cpufreq/cpuinfo_max_freq`, which is in kHz.
pub fn mhz_of_khz(text: &str) -> Option<u64> {
    text.trim().parse::<u64>().ok().filter(|khz| *khz > 0).map(|khz| (khz + 500) / 1000)
}

/// `MemTotal` from `/proc/meminfo`, in bytes.
pub fn mem_total_bytes(text: &str) -> Option<u64> {
    let line = text.lines().find(|line| line.starts_with("MemTotal:"))?;
    let mut fields = line.split_whitespace().skip(1);
    let amount = fields.next()?.parse::<u64>().ok()?;
    match fields.next() {
        Some("kB") => amount.checked_mul(1024),
        None => Some(amount),
        Some(_) => None,
    }
}

/// `ID` and `VERSION_ID` of an `os-release` file (Nomad's `os.name` and
/// `os.version`), unquoted.
pub fn os_release(text: &str) -> (Option<String>, Option<String>) {
    let value = |key: &str| {
        text.lines().find_map(|line| {
            let (name, value) = line.trim().split_once('=')?;
            let value = value.trim().trim_matches(|c| c == '"' || c == '\'');
            (name == key && !value.is_empty()).then(|| value.to_string())
        })
    };
    (value("ID"), value("VERSION_ID"))
}

/// The source (device) of the mount `path` is on, from
/// `/proc/self/mountinfo`: the mount whose mount point is the longest
/// prefix of `path` (Nomad's `unique.storage.volume`, as `df` names it).
pub fn mount_source(mountinfo: &str, path: &Path) -> Option<String> {
    mountinfo
        .lines()
        .filter_map(|line| {
            let (before, after) = line.split_once(" - ")?;
            let mount_point = unescape_octal(before.split_whitespace().nth(4)?);
            let source = unescape_octal(after.split_whitespace().nth(1)?);
            path.starts_with(&mount_point).then_some((mount_point.len(), source))
        })
        // The last of equally long mount points is the one on top.
        .fold(None, |best: Option<(usize, String)>, found| match &best {
            Some((len, _)) if *len > found.0 => best,
            _ => Some(found),
        })
        .map(|(_, source)| source)
}

/// Undoes mountinfo's octal escapes (`\040` for a space).
fn unescape_octal(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let escaped =
            bytes.get(i + 1..i + 4).filter(|digits| bytes[i] == b'\\' && digits.iter().all(u8::is_ascii_digit));
        match escaped.and_then(|digits| u8::from_str_radix(std::str::from_utf8(digits).ok()?, 8).ok()) {
            Some(byte) => {
                out.push(byte);
                i += 4;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Go's `GOARCH` name of a Rust target architecture (Nomad's `cpu.arch`).
pub fn go_arch(arch: &str) -> &str {
    match arch {
        "x86_64" => "amd64",
        "x86" => "386",
        "aarch64" => "arm64",
        "powerpc64" if cfg!(target_endian = "little") => "ppc64le",
        "powerpc64" => "ppc64",
        "loongarch64" => "loong64",
        "mips64" if cfg!(target_endian = "little") => "mips64le",
        "mips" if cfg!(target_endian = "little") => "mipsle",
        other => other,
    }
}

/// An IP network (`10.0.0.0/8`, `fd00::/8`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cidr {
    network: IpAddr,
    prefix: u8,
}

impl Cidr {
    /// Reads `address/prefix`; a bare address is a network of one.
    pub fn parse(text: &str) -> Result<Cidr, String> {
        let (address, prefix) = text.trim().split_once('/').unwrap_or((text.trim(), ""));
        let network: IpAddr = address.parse().map_err(|_| format!("{text:?} is not an address/prefix"))?;
        let max = if network.is_ipv4() { 32 } else { 128 };
        let prefix =
            if prefix.is_empty() { max } else { prefix.parse::<u8>().map_err(|_| format!("{text:?}: bad prefix"))? };
        if prefix > max {
            return Err(format!("{text:?}: a prefix of at most {max}"));
        }
        Ok(Cidr { network, prefix })
    }

    /// Whether `ip` is in the network.
    pub fn contains(&self, ip: IpAddr) -> bool {
        let bits = |ip: IpAddr| match ip {
            IpAddr::V4(v4) => (u128::from(u32::from(v4)) << 96, 32),
            IpAddr::V6(v6) => (u128::from(v6), 128),
        };
        let ((network, width), (candidate, candidate_width)) = (bits(self.network), bits(ip));
        if width != candidate_width {
            return false;
        }
        let mask = if self.prefix == 0 { 0 } else { u128::MAX << (128 - u32::from(self.prefix)) };
        network & mask == candidate & mask
    }
}

impl std::fmt::Display for Cidr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.network, self.prefix)
    }
}

#[cfg(test)]
#[path = "fingerprint_test.rs"]
mod fingerprint_test;
