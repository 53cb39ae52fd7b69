//! What the benches share.

/// Resident set size of this process (VmRSS), in MiB; 0 where /proc is missing.
pub fn rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kib = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.split_whitespace().next().and_then(|kib| kib.parse::<f64>().ok()));
    kib.unwrap_or(0.0) / 1024.0
}
