//! Where a record goes in Kafka: the topic names a template gives (as Kafka allows them), and
//! the partition of an edge, as Kafka's own default partitioner would pick it.

/// Kafka's own limit on a topic name.
const MAX_NAME: usize = 249;

/// Whether `name` is a topic name Kafka takes.
pub(crate) fn valid_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > MAX_NAME || name == "." || name == ".." {
        return Err(format!("{name:?} is not a topic name: 1 to {MAX_NAME} characters, not . or .."));
    }
    match name.chars().find(|c| !allowed(*c)) {
        Some(c) => Err(format!("{name:?} is not a topic name: {c:?} is none of a-z A-Z 0-9 . _ -")),
        None => Ok(()),
    }
}

fn allowed(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')
}

/// One piece of a topic template.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Piece {
    Text(String),
    Class,
    Edge,
    /// An MQTT topic level, from 0.
    Level(usize),
}

/// A records topic name template: text with `{class}`, `{edge}` and `{1}`..`{9}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Template(Vec<Piece>);

impl Template {
    pub(crate) fn parse(text: &str) -> Result<Self, String> {
        let mut pieces = Vec::new();
        let mut rest = text;
        while let Some(open) = rest.find('{') {
            if open > 0 {
                pieces.push(Piece::Text(rest[..open].to_owned()));
            }
            let close = rest[open..].find('}').ok_or_else(|| format!("{text:?}: a {{ without its }}"))? + open;
            let piece = match &rest[open + 1..close] {
                "class" => Piece::Class,
                "edge" => Piece::Edge,
                n => match n.parse::<usize>() {
                    Ok(level @ 1..=9) => Piece::Level(level - 1),
                    _ => return Err(format!("{text:?}: {{{n}}} is none of {{class}}, {{edge}}, {{1}}..{{9}}")),
                },
            };
            pieces.push(piece);
            rest = &rest[close + 1..];
        }
        if !rest.is_empty() {
            pieces.push(Piece::Text(rest.to_owned()));
        }
        for p in &pieces {
            if let Piece::Text(t) = p
                && let Some(c) = t.chars().find(|c| !allowed(*c))
            {
                return Err(format!("{text:?}: {c:?} is none of a-z A-Z 0-9 . _ -"));
            }
        }
        if pieces.is_empty() {
            return Err("an empty topic template".into());
        }
        Ok(Template(pieces))
    }

    /// The topic of a record of `class` from `edge` on MQTT topic `topic`: what Kafka does not
    /// allow in a name becomes `_`, a missing level `_`, and the name is cut at Kafka's limit.
    pub(crate) fn expand(&self, class: &str, edge: &str, topic: &str) -> String {
        let mut out = String::with_capacity(64);
        for part in self.parts(edge, topic) {
            out.push_str(&part.unwrap_or_else(|| clean(class)));
        }
        if out == "." || out == ".." {
            out = out.replace('.', "_");
        }
        let mut end = out.len().min(MAX_NAME);
        while !out.is_char_boundary(end) {
            end -= 1;
        }
        out.truncate(end);
        out
    }
}

impl Template {
    /// The pieces of a name for `edge` and `topic`, the class's left out (`None`).
    fn parts(&self, edge: &str, topic: &str) -> Vec<Option<String>> {
        self.0
            .iter()
            .map(|p| match p {
                Piece::Text(t) => Some(t.clone()),
                Piece::Class => None,
                Piece::Edge => Some(clean(edge)),
                Piece::Level(n) => Some(clean(topic.split('/').nth(*n).unwrap_or(""))),
            })
            .collect()
    }

    /// Whether topic `name` could hold records of `edge` on MQTT topic `topic`, of some class
    /// (a name cut at Kafka's limit is not recognised).
    pub(crate) fn could_hold(&self, name: &str, edge: &str, topic: &str) -> bool {
        fn matches(name: &str, parts: &[Option<String>]) -> bool {
            match parts.split_first() {
                None => name.is_empty(),
                Some((Some(text), rest)) => name.strip_prefix(text.as_str()).is_some_and(|r| matches(r, rest)),
                Some((None, rest)) => (1..=name.len())
                    .filter(|i| name.is_char_boundary(*i))
                    .take_while(|i| name[..*i].chars().all(allowed))
                    .any(|i| matches(&name[i..], rest)),
            }
        }
        matches(name, &self.parts(edge, topic))
    }
}

/// A value as a piece of a name: what Kafka does not allow becomes `_`, and nothing `_`.
fn clean(s: &str) -> String {
    if s.is_empty() {
        return "_".into();
    }
    s.chars().map(|c| if allowed(c) { c } else { '_' }).collect()
}

/// Kafka's default partitioner's hash (murmur2, as the Java client computes it), so an edge's
/// partition is the one any Kafka producer would pick for the edge id as key.
fn murmur2(data: &[u8]) -> u32 {
    const SEED: u32 = 0x9747_b28c;
    const M: u32 = 0x5bd1_e995;
    let mut h = SEED ^ data.len() as u32;
    let mut chunks = data.chunks_exact(4);
    for c in &mut chunks {
        let mut k = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> 24;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    let tail = chunks.remainder();
    if tail.len() >= 3 {
        h ^= u32::from(tail[2]) << 16;
    }
    if tail.len() >= 2 {
        h ^= u32::from(tail[1]) << 8;
    }
    if !tail.is_empty() {
        h ^= u32::from(tail[0]);
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h
}

/// The partition of `edge`'s records among `partitions`.
pub(crate) fn partition_of(edge: &str, partitions: i32) -> i32 {
    ((murmur2(edge.as_bytes()) & 0x7fff_ffff) % partitions.max(1) as u32) as i32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_expand_to_names_kafka_takes() {
        let t = Template::parse("edge.{class}.{1}-{edge}").unwrap();
        assert_eq!(t.expand("inference", "cam-1", "results/yolo v3/x"), "edge.inference.results-cam-1");
        assert_eq!(t.expand("a/b", "é", ""), "edge.a_b._-_");
        let long = "x".repeat(400);
        assert_eq!(Template::parse("{class}").unwrap().expand(&long, "e", "t").len(), MAX_NAME);
        assert!(valid_name(&Template::parse("{1}").unwrap().expand("c", "e", "..")).is_ok());
        // A reply is looked for in the topics that could hold it, whatever its class.
        assert!(t.could_hold("edge.inference.results-cam-1", "cam-1", "results/x"));
        assert!(t.could_hold("edge.full.results-cam-1", "cam-1", "results"));
        assert!(!t.could_hold("edge.full.results-cam-2", "cam-1", "results"));
        assert!(!t.could_hold("edge..results-cam-1", "cam-1", "results"));
        assert!(Template::parse("edge.{class}").unwrap().could_hold("edge.a.b", "e", "t"));
        for bad in ["edge.{klass}", "edge.{0}", "edge.{10}", "a b", "{class", ""] {
            assert!(Template::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn murmur2_is_the_java_clients() {
        // What org.apache.kafka.common.utils.Utils.murmur2 of kafka-clients 4.4 gives, and
        // toPositive(murmur2) % 6 for the partition.
        assert_eq!(murmur2(b"21") as i32, -973932308);
        assert_eq!(murmur2(b"foobar") as i32, -790332482);
        assert_eq!(murmur2(b"a-little-bit-long-string") as i32, -985981536);
        assert_eq!(murmur2(b"a-little-bit-longer-string") as i32, -1486304829);
        assert_eq!(murmur2(b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8") as i32, -58897971);
        assert_eq!(murmur2(b"abc") as i32, 479470107);
        assert_eq!(partition_of("edge-1", 6), 5);
        assert_eq!(partition_of("abc", 6), 3);
    }
}
