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

/// Most nameservers a resolver reads (glibc's `MAXNS`); the kubelet keeps as many.
const MAX_NAMESERVERS: usize = 3;

/// The resolvers of a resolv.conf (the machine's, standing for the VPC's): its IPv4
/// `nameserver`s except loopback ones (a group's network namespace has its own loopback, where
/// no resolver listens), its `search` domains (the last such line wins, as in glibc) and its
/// `options`. Words a resolv.conf could not carry are left out.
pub fn parse_resolv_conf(text: &str) -> Dns {
    let mut dns = Dns::default();
    for line in text.lines() {
        let mut words = line.split_whitespace();
        let keyword = words.next();
        let usable = |word: &&str| crate::sandbox::names::dns_word(word).is_ok();
        match keyword {
            Some("nameserver") => {
                if let Some(ip) = words.next().and_then(|w| w.parse::<Ipv4Addr>().ok()) {
                    if !ip.is_loopback() && !ip.is_unspecified() {
                        dns.nameservers.push(ip);
                    }
                }
            }
            Some("search" | "domain") => {
                dns.searches = words.filter(usable).map(str::to_owned).collect();
            }
            Some("options") => dns.options.extend(words.filter(usable).map(str::to_owned)),
            _ => {}
        }
    }
    dns
}

/// The group's name service set-up from ECI's `DnsPolicy` and `DnsConfig`: `None` is the
/// `DnsConfig` alone; `Default` (and no policy) is the instance's own resolvers (`host`, the
/// VPC's) with the `DnsConfig` merged in the kubelet's way — its nameservers after the host's,
/// its search domains before the host's, its options replacing the host's of the same name;
/// duplicates dropped, at most three nameservers.
pub fn group_dns(policy: &str, config: &Dns, host: &Dns) -> Dns {
    let base = if policy == "None" {
        Dns::default()
    } else {
        host.clone()
    };
    let mut nameservers = base.nameservers;
    nameservers.extend(&config.nameservers);
    let mut searches = config.searches.clone();
    searches.extend(base.searches);
    let option_name = |option: &str| option.split(':').next().unwrap_or_default().to_owned();
    let mut options: Vec<String> = base
        .options
        .into_iter()
        .filter(|option| {
            !config
                .options
                .iter()
                .any(|ours| option_name(ours) == option_name(option))
        })
        .collect();
    options.extend(config.options.iter().cloned());
    let mut dns = Dns {
        nameservers: distinct(nameservers),
        searches: distinct(searches),
        options: distinct(options),
    };
    dns.nameservers.truncate(MAX_NAMESERVERS);
    dns
}

/// `items` without repeats, first occurrences kept in order.
fn distinct<T: PartialEq>(items: Vec<T>) -> Vec<T> {
    let mut kept = Vec::with_capacity(items.len());
    for item in items {
        if !kept.contains(&item) {
            kept.push(item);
        }
    }
    kept
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
    fn the_machines_resolv_conf_gives_its_usable_resolvers() {
        let text = "# generated\nnameserver 127.0.0.53\nnameserver 10.255.255.53\n\
                    nameserver fe80::1\nnameserver 192.168.1.1\nsearch a.example b.example\n\
                    options edns0 trust-ad\noptions ndots:2\n";
        assert_eq!(
            parse_resolv_conf(text),
            Dns {
                nameservers: vec![
                    Ipv4Addr::new(10, 255, 255, 53),
                    Ipv4Addr::new(192, 168, 1, 1)
                ],
                searches: vec!["a.example".into(), "b.example".into()],
                options: vec!["edns0".into(), "trust-ad".into(), "ndots:2".into()],
            }
        );
        assert_eq!(parse_resolv_conf(""), Dns::default());
        assert_eq!(
            parse_resolv_conf("search old.example\nsearch new.example\n").searches,
            vec!["new.example".to_owned()]
        );
    }

    #[test]
    fn the_policy_says_whose_resolvers_the_group_gets() {
        let ip = |last| Ipv4Addr::new(10, 0, 0, last);
        let host = Dns {
            nameservers: vec![ip(1), ip(2)],
            searches: vec!["vpc.example".into()],
            options: vec!["ndots:1".into(), "edns0".into()],
        };
        let ours = Dns {
            nameservers: vec![ip(2), ip(3), ip(4)],
            searches: vec!["ns.svc.cluster.local".into(), "vpc.example".into()],
            options: vec!["ndots:5".into()],
        };
        let cases = [
            ("Default", Dns::default(), host.clone()),
            ("", Dns::default(), host.clone()),
            (
                "Default",
                ours.clone(),
                Dns {
                    nameservers: vec![ip(1), ip(2), ip(3)],
                    searches: vec!["ns.svc.cluster.local".into(), "vpc.example".into()],
                    options: vec!["edns0".into(), "ndots:5".into()],
                },
            ),
            ("None", ours.clone(), ours),
            ("None", Dns::default(), Dns::default()),
        ];
        for (policy, config, expected) in cases {
            assert_eq!(
                group_dns(policy, &config, &host),
                expected,
                "{policy:?} {config:?}"
            );
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
