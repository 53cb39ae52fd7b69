use std::net::IpAddr;
use std::path::Path;

use super::*;

fn address(interface: &str, ip: &str) -> InterfaceAddress {
    InterfaceAddress { interface: interface.to_string(), ip: ip.parse().expect("an address") }
}

fn ip(text: &str) -> IpAddr {
    text.parse().expect("an address")
}

/// A host with loopback, a wired interface with both families, a bridge,
/// and an IPv6-only interface.
fn host() -> Vec<InterfaceAddress> {
    vec![
        address("lo", "127.0.0.1"),
        address("lo", "::1"),
        address("eth0", "fe80::1"),
        address("eth0", "192.0.2.10"),
        address("eth0", "192.0.2.11"),
        address("docker0", "172.17.0.1"),
        address("wg0", "fe80::2"),
        address("wg0", "fd00::7"),
    ]
}

#[test]
fn an_interface_s_address_is_its_first_ipv4_else_a_routable_ipv6() {
    let host = host();
    assert_eq!(pick_address(&host, "eth0"), Some(ip("192.0.2.10")), "IPv4 before an earlier IPv6");
    assert_eq!(pick_address(&host, "wg0"), Some(ip("fd00::7")), "not the link-local one");
    assert_eq!(pick_address(&host, "lo"), Some(ip("127.0.0.1")));
    assert_eq!(pick_address(&host, "eth9"), None);
    let link_local_only = vec![address("ib0", "fe80::9")];
    assert_eq!(pick_address(&link_local_only, "ib0"), Some(ip("fe80::9")), "better than nothing");
}

#[test]
fn a_configured_interface_that_is_missing_or_bare_is_an_error_naming_the_key() {
    let host = host();
    let found = configured_interface_address(&host, "docker0").expect("exists");
    assert_eq!(found, FoundAddress { device: "docker0".into(), ip: ip("172.17.0.1") });
    let missing = configured_interface_address(&host, "eth9").expect_err("no such interface").to_string();
    assert!(missing.starts_with("client.network_interface: no interface \"eth9\""), "{missing}");
    assert!(missing.contains("lo, eth0, docker0, wg0"), "names what there is: {missing}");
}

#[test]
fn the_default_route_names_the_interface() {
    let route = "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n\
        eth0\t00000000\t010200C0\t0003\t0\t0\t100\t00000000\t0\t0\t0\n\
        docker0\t000011AC\t00000000\t0001\t0\t0\t0\t0000FFFF\t0\t0\t0\n\
        wlan0\t00000000\t0101A8C0\t0003\t0\t0\t600\t00000000\t0\t0\t0\n\
        eth0\t000200C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n";
    assert_eq!(default_route_interface(route).as_deref(), Some("eth0"), "the lowest metric");
    let no_default = "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\n\
        docker0\t000011AC\t00000000\t0001\t0\t0\t0\t0000FFFF\n";
    assert_eq!(default_route_interface(no_default), None);
    let down = "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\n\
        eth1\t00000000\t010200C0\t0002\t0\t0\t0\t00000000\n";
    assert_eq!(default_route_interface(down), None, "a route that is not up");
}

#[test]
fn the_ipv6_default_route_names_the_interface_but_never_lo() {
    let zeros = "00000000000000000000000000000000";
    let route = format!(
        "{zeros} 00 {zeros} 00 {zeros} ffffffff 00000001 00000000 00200200       lo\n\
         fd000000000000000000000000000000 40 {zeros} 00 {zeros} 00000100 00000001 00000000 00000001     eth1\n\
         {zeros} 00 {zeros} 00 fe800000000000000000000000000001 00000400 00000001 00000000 00000003     eth1\n"
    );
    assert_eq!(default_route6_interface(&route).as_deref(), Some("eth1"));
    let unreachable_only = format!("{zeros} 00 {zeros} 00 {zeros} ffffffff 00000001 00000000 00200200       lo\n");
    assert_eq!(default_route6_interface(&unreachable_only), None);
}

#[test]
fn a_host_network_is_found_by_cidr_interface_or_both() {
    let host = host();
    let spec = |cidr: Option<&str>, interface: Option<&str>| HostNetworkSpec {
        name: "public".into(),
        cidr: cidr.map(|cidr| Cidr::parse(cidr).expect("a cidr")),
        interface: interface.map(str::to_string),
    };
    let by_cidr = host_network_address(&spec(Some("192.0.2.0/24"), None), &host).expect("found");
    assert_eq!(by_cidr, FoundAddress { device: "eth0".into(), ip: ip("192.0.2.10") });
    let by_interface = host_network_address(&spec(None, Some("docker0")), &host).expect("found");
    assert_eq!(by_interface.ip, ip("172.17.0.1"));
    let both = host_network_address(&spec(Some("192.0.2.11/32"), Some("eth0")), &host).expect("found");
    assert_eq!(both.ip, ip("192.0.2.11"));
    assert_eq!(host_network_address(&spec(Some("192.0.2.0/24"), Some("docker0")), &host), None);
    assert_eq!(host_network_address(&spec(Some("fd00::/8"), None), &host).map(|found| found.ip), Some(ip("fd00::7")));
    assert_eq!(host_network_address(&spec(Some("198.51.100.0/24"), None), &host), None, "nothing in it");
    assert_eq!(host_network_address(&spec(None, None), &host), None, "nowhere to look");
}

#[test]
fn cidrs_parse_and_contain() {
    let ten = Cidr::parse("10.0.0.0/8").expect("valid");
    assert!(ten.contains(ip("10.255.1.2")) && !ten.contains(ip("11.0.0.1")));
    assert!(!ten.contains(ip("::ffff:10.0.0.1")), "another family");
    assert!(Cidr::parse("0.0.0.0/0").expect("valid").contains(ip("203.0.113.9")));
    assert!(Cidr::parse("fd00::/8").expect("valid").contains(ip("fd12::1")));
    assert!(Cidr::parse("192.0.2.7").expect("one address").contains(ip("192.0.2.7")));
    assert_eq!(Cidr::parse("192.0.2.7").expect("valid").to_string(), "192.0.2.7/32");
    assert!(Cidr::parse("10.0.0.0/33").is_err());
    assert!(Cidr::parse("ten/8").is_err());
    assert!(Cidr::parse("10.0.0.0/x").is_err());
}

const CPUINFO_X86: &str = "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 7B13\n\
    cpu MHz\t\t: 2449.998\ncache size\t: 512 KB\n\nprocessor\t: 1\nmodel name\t: AMD EPYC 7B13\ncpu MHz\t\t: 3100.000\n";

const CPUINFO_ARM: &str = "processor\t: 0\nBogoMIPS\t: 50.00\nFeatures\t: fp asimd\nCPU implementer\t: 0x41\n\n\
    processor\t: 1\nBogoMIPS\t: 50.00\n\nHardware\t: BCM2835\nModel\t\t: Raspberry Pi 4 Model B Rev 1.4\n";

#[test]
fn cpuinfo_gives_the_first_processor_s_model_and_frequency() {
    let x86 = cpu_info(CPUINFO_X86);
    assert_eq!(x86.model_name.as_deref(), Some("AMD EPYC 7B13"));
    assert_eq!(x86.mhz, Some(2449.998), "the first processor's, not the second's");
    let arm = cpu_info(CPUINFO_ARM);
    assert_eq!(arm.mhz, None, "not published: left out, never assumed");
    assert_eq!(arm.model_name, None, "the board's model is in a later block, not the first processor's");
    assert_eq!(mhz_of_khz("3500000\n"), Some(3500));
    assert_eq!(mhz_of_khz("2449998"), Some(2450));
    assert_eq!(mhz_of_khz("0"), None);
}

#[test]
fn meminfo_and_os_release_are_read_as_nomad_reads_them() {
    let meminfo = "MemTotal:       16314488 kB\nMemFree:         1234567 kB\n";
    assert_eq!(mem_total_bytes(meminfo), Some(16_314_488 * 1024));
    assert_eq!(mem_total_bytes("MemFree: 1 kB\n"), None);
    let debian = "PRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\nNAME=\"Debian GNU/Linux\"\n\
        VERSION_ID=\"12\"\nID=debian\n";
    assert_eq!(os_release(debian), (Some("debian".into()), Some("12".into())));
    let arch = "NAME=\"Arch Linux\"\nID=arch\nBUILD_ID=rolling\n";
    assert_eq!(os_release(arch), (Some("arch".into()), None), "a rolling release has no version");
    let ubuntu = "ID_LIKE=debian\nID=ubuntu\nVERSION_ID='24.04'\n";
    assert_eq!(os_release(ubuntu), (Some("ubuntu".into()), Some("24.04".into())), "ID_LIKE is not ID");
}

#[test]
fn the_data_dir_s_volume_is_its_deepest_mount() {
    let mountinfo = "22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw\n\
        30 22 0:26 / /proc rw - proc proc rw\n\
        41 22 254:16 / /var/lib rw,relatime shared:5 - xfs /dev/vdb1 rw\n\
        42 41 254:32 / /var/lib/drover\\040data rw,relatime - ext4 /dev/vdc rw\n";
    let source = |path: &str| mount_source(mountinfo, Path::new(path));
    assert_eq!(source("/var/lib/drover data/alloc").as_deref(), Some("/dev/vdc"), "an escaped space");
    assert_eq!(source("/var/lib/drover").as_deref(), Some("/dev/vdb1"), "a prefix of a name is not a parent");
    assert_eq!(source("/home/x").as_deref(), Some("/dev/vda"));
    let stacked = "22 1 254:0 / / rw - ext4 /dev/vda rw\n23 22 0:40 / / rw - overlay overlay rw\n";
    assert_eq!(mount_source(stacked, Path::new("/srv")).as_deref(), Some("overlay"), "the mount on top");
}

#[test]
fn architectures_have_go_s_names() {
    assert_eq!(go_arch("x86_64"), "amd64");
    assert_eq!(go_arch("aarch64"), "arm64");
    assert_eq!(go_arch("x86"), "386");
    assert_eq!(go_arch("s390x"), "s390x");
    assert_eq!(go_arch("riscv64"), "riscv64");
}

/// Runs `program args` and returns its trimmed standard output.
fn command_output(program: &str, args: &[&str]) -> String {
    let output = std::process::Command::new(program).args(args).output().expect("the command runs");
    assert!(output.status.success(), "{program} {args:?}: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8_lossy(&output.stdout).trim().to_string()
}

/// The fingerprint of this machine against what the machine reports by
/// other means: `uname`, `nproc`, `df` and the files in `/proc` read here
/// with plain string searches.
#[test]
fn the_real_host_s_fingerprint_matches_what_the_host_reports() {
    let data_dir = std::env::temp_dir();
    let settings = FingerprintSettings {
        data_dir: data_dir.clone(),
        network_interface: None,
        server: Some("192.0.2.1:4647".parse().expect("an address")),
        host_networks: vec![HostNetworkSpec { name: "loopback".into(), cidr: None, interface: Some("lo".into()) }],
    };
    let found = Fingerprint::of_host(&settings).expect("this host can be fingerprinted");
    let attr = |key: &str| found.attributes.get(key).cloned().unwrap_or_else(|| panic!("no attribute {key}"));

    assert_eq!(attr("kernel.name"), command_output("uname", &["-s"]).to_lowercase());
    assert_eq!(attr("kernel.version"), command_output("uname", &["-r"]));
    assert_eq!(attr("kernel.arch"), command_output("uname", &["-m"]));
    assert_eq!(attr("unique.hostname"), command_output("uname", &["-n"]));
    let expected_arch = match command_output("uname", &["-m"]).as_str() {
        "x86_64" => "amd64".to_string(),
        "aarch64" | "arm64" => "arm64".to_string(),
        other => other.to_string(),
    };
    assert_eq!(attr("cpu.arch"), expected_arch);
    assert_eq!(attr("cpu.numcores"), command_output("nproc", &[]));

    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").expect("cpuinfo");
    let reported_mhz = std::fs::read_to_string("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq")
        .ok()
        .map(|khz| (khz.trim().parse::<f64>().expect("kHz") / 1000.0).round() as u64)
        .or_else(|| {
            let line = cpuinfo.lines().find(|line| line.starts_with("cpu MHz"))?;
            Some(line.rsplit(':').next()?.trim().parse::<f64>().ok()?.round() as u64)
        });
    if let Some(mhz) = reported_mhz {
        assert_eq!(attr("cpu.frequency"), mhz.to_string());
        assert_eq!(attr("cpu.totalcompute"), (mhz * found.cpu_cores).to_string(), "cores × MHz");
        assert_eq!(found.cpu_total_compute(), Some(mhz * found.cpu_cores));
    } else {
        assert!(!found.attributes.contains_key("cpu.frequency"), "not published, not assumed");
    }
    if let Some(model) = cpuinfo.lines().find(|line| line.starts_with("model name")) {
        assert_eq!(attr("cpu.modelname"), model.split_once(':').expect("a value").1.trim());
    }

    let meminfo = std::fs::read_to_string("/proc/meminfo").expect("meminfo");
    let kib: u64 = meminfo
        .lines()
        .find(|line| line.starts_with("MemTotal:"))
        .and_then(|line| line.split_whitespace().nth(1))
        .and_then(|kib| kib.parse().ok())
        .expect("MemTotal");
    assert_eq!(attr("memory.totalbytes"), (kib * 1024).to_string());

    let os_release = std::fs::read_to_string("/etc/os-release").expect("os-release");
    let id = os_release.lines().find_map(|line| line.strip_prefix("ID=")).expect("ID").trim_matches('"');
    assert_eq!(attr("os.name"), id);
    if let Some(version) = os_release.lines().find_map(|line| line.strip_prefix("VERSION_ID=")) {
        assert_eq!(attr("os.version"), version.trim_matches('"'));
    }

    let df = command_output("df", &["-P", "-B1", &data_dir.display().to_string()]);
    let row: Vec<&str> = df.lines().last().expect("a row").split_whitespace().collect();
    assert_eq!(attr("unique.storage.volume"), row[0], "df's file system");
    assert_eq!(attr("unique.storage.bytestotal"), row[1], "df's size");
    let total: u64 = attr("unique.storage.bytestotal").parse().expect("a number");
    let free: u64 = attr("unique.storage.bytesfree").parse().expect("a number");
    assert!(free > 0 && free <= total, "free {free} of {total}");
    assert_eq!(found.disk_free_bytes, free);

    let interfaces = interface_addresses();
    let address = found.address.ip;
    assert!(interfaces.iter().any(|found| found.ip == address), "{address} is one of this host's: {interfaces:?}");
    assert_eq!(attr("unique.network.ip-address"), address.to_string());
    if let Some(route) = std::fs::read_to_string("/proc/net/route").ok().and_then(|text| default_route_interface(&text))
    {
        assert_eq!(found.address.device, route, "the default route's interface");
    }
    assert_eq!(found.host_networks["loopback"].ip, ip("127.0.0.1"));
    assert_eq!(attr("nomad.version"), NOMAD_VERSION);
    assert_eq!(attr("drover.version"), env!("CARGO_PKG_VERSION"));

    let lo = FingerprintSettings { network_interface: Some("lo".into()), ..settings.clone() };
    let on_lo = Fingerprint::of_host(&lo).expect("lo exists");
    assert_eq!(on_lo.address, FoundAddress { device: "lo".into(), ip: ip("127.0.0.1") });
    let missing = FingerprintSettings { network_interface: Some("nonexistent0".into()), ..settings };
    let refused = Fingerprint::of_host(&missing).expect_err("no such interface").to_string();
    assert!(refused.contains("client.network_interface") && refused.contains("nonexistent0"), "{refused}");
}
