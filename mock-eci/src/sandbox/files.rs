//! What the sandbox writes for a group and its containers, as text: /etc/hostname, /etc/hosts,
//! /etc/resolv.conf, and the log line format. Pure.

use std::net::Ipv4Addr;

/// The group's name service set-up (ECI's DnsConfig; empty fields are left out of the file).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Dns {
    pub nameservers: Vec<Ipv4Addr>,
    pub searches: Vec<String>,
    pub options: Vec<String>,
}

/// Extra /etc/hosts entries (ECI's HostAliases).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostAlias {
    pub ip: Ipv4Addr,
    pub hostnames: Vec<String>,
}

pub fn hostname_file(hostname: &str) -> String {
    format!("{hostname}\n")
}

/// The group's /etc/hosts: loopback, the group's own address under its host name, then the
/// aliases, as the kubelet writes it.
pub fn hosts_file(hostname: &str, ip: Ipv4Addr, aliases: &[HostAlias]) -> String {
    let mut text = String::from(
        "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n\
         fe00::0\tip6-localnet\nfe00::0\tip6-mcastprefix\nfe00::1\tip6-allnodes\n\
         fe00::2\tip6-allrouters\n",
    );
    text.push_str(&format!("{ip}\t{hostname}\n"));
    for alias in aliases.iter().filter(|alias| !alias.hostnames.is_empty()) {
        text.push_str(&format!("{}\t{}\n", alias.ip, alias.hostnames.join("\t")));
    }
    text
}

pub fn resolv_conf(dns: &Dns) -> String {
    let mut text = String::new();
    for server in &dns.nameservers {
        text.push_str(&format!("nameserver {server}\n"));
    }
    if !dns.searches.is_empty() {
        text.push_str(&format!("search {}\n", dns.searches.join(" ")));
    }
    if !dns.options.is_empty() {
        text.push_str(&format!("options {}\n", dns.options.join(" ")));
    }
    text
}

/// Which of a container's output streams a log line came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
}

/// One log line in the CRI format the kubelet writes: RFC 3339 timestamp, stream, `F` for a
/// full line or `P` for a part of one cut at the length bound, then the text.
pub fn log_line(at: jiff::Timestamp, stream: Stream, chunk: &[u8]) -> Vec<u8> {
    let (text, tag) = match chunk.strip_suffix(b"\n") {
        Some(line) => (line, "F"),
        None => (chunk, "P"),
    };
    let stream = match stream {
        Stream::Stdout => "stdout",
        Stream::Stderr => "stderr",
    };
    let mut line = format!("{at} {stream} {tag} ").into_bytes();
    line.extend_from_slice(text);
    line.push(b'\n');
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_lists_the_group_then_its_aliases() {
        let aliases = [
            HostAlias {
                ip: Ipv4Addr::new(10, 1, 2, 3),
                hostnames: vec!["db".into(), "db.local".into()],
            },
            HostAlias {
                ip: Ipv4Addr::new(10, 1, 2, 4),
                hostnames: vec![],
            },
        ];
        let text = hosts_file("web-0", Ipv4Addr::new(10, 213, 0, 2), &aliases);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "127.0.0.1\tlocalhost");
        assert_eq!(lines[lines.len() - 2], "10.213.0.2\tweb-0");
        assert_eq!(lines[lines.len() - 1], "10.1.2.3\tdb\tdb.local");
    }

    #[test]
    fn resolv_conf_leaves_out_what_is_empty() {
        let cases = [
            (Dns::default(), ""),
            (
                Dns {
                    nameservers: vec![Ipv4Addr::new(10, 0, 0, 10)],
                    searches: vec![
                        "default.svc.cluster.local".into(),
                        "svc.cluster.local".into(),
                    ],
                    options: vec!["ndots:5".into()],
                },
                "nameserver 10.0.0.10\nsearch default.svc.cluster.local svc.cluster.local\noptions ndots:5\n",
            ),
            (
                Dns {
                    options: vec!["timeout:1".into()],
                    ..Dns::default()
                },
                "options timeout:1\n",
            ),
        ];
        for (dns, expected) in cases {
            assert_eq!(resolv_conf(&dns), expected, "{dns:?}");
        }
    }

    #[test]
    fn log_lines_are_timestamped_and_tagged() {
        let at: jiff::Timestamp = "2026-11-28T21:00:00.5Z".parse().expect("timestamp");
        let cases: [(Stream, &[u8], &str); 3] = [
            (
                Stream::Stdout,
                b"hello\n",
                "2026-11-28T21:00:00.5Z stdout F hello\n",
            ),
            (
                Stream::Stderr,
                b"cut",
                "2026-11-28T21:00:00.5Z stderr P cut\n",
            ),
            (Stream::Stdout, b"\n", "2026-11-28T21:00:00.5Z stdout F \n"),
        ];
        for (stream, chunk, expected) in cases {
            assert_eq!(
                String::from_utf8(log_line(at, stream, chunk)).expect("utf-8"),
                expected
            );
        }
    }
}
