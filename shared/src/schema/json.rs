//! JSON Schema: validation by `jsonschema`, compatibility by our rules.
//!
//! `reads(reader, writer)` asks whether every document the writer schema accepts is accepted by
//! the reader schema. The rules follow Confluent's list for JSON Schema (type narrowed,
//! required property added, property added to an open content model, property removed from a
//! closed content model, additional properties narrowed, enum narrowed, bounds tightened),
//! applied recursively through `properties`, `additionalProperties` and `items`, and through
//! the combinators as Confluent takes them (a `oneOf`/`anyOf` extended with subschemas, an
//! `allOf` narrowed to fewer, one combinator changed for a wider one, subschemas in any
//! order: each subschema a writer could match read by the reader's), `not` (the excluded set
//! narrowed), `pattern` and `uniqueItems` dropped, `multipleOf` dropped or divided,
//! `dependencies` dropped. A keyword the rules do not model (`$ref`, `if`, ...) that differs
//! between the two versions is a problem of its own: the check reports what it cannot prove, so
//! a pass is never a guess.

use serde_json::{Map, Value};

use super::{Invalid, Problem, problem};

pub(super) struct Json {
    schema: Value,
    validator: jsonschema::Validator,
}

impl Json {
    pub(super) fn parse(text: &str) -> Result<Self, String> {
        let schema: Value = serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
        if !schema.is_object() && !schema.is_boolean() {
            return Err("a JSON Schema is an object or a boolean".into());
        }
        // The `regex` crate runs in time linear in the input: a schema's `pattern` cannot make
        // one payload cost more than its length.
        let validator = jsonschema::options()
            .with_pattern_options(jsonschema::PatternOptions::regex())
            .build(&schema)
            .map_err(|e| e.to_string())?;
        Ok(Json { schema, validator })
    }

    /// Sorted keys, no spaces.
    pub(super) fn normal(&self) -> String {
        let mut out = String::new();
        canonical(&self.schema, &mut out);
        out
    }

    pub(super) fn validate(&self, payload: &[u8]) -> Result<(), Invalid> {
        let value: Value = serde_json::from_slice(payload)
            .map_err(|e| Invalid { path: String::new(), reason: format!("not JSON: {e}") })?;
        self.validator
            .validate(&value)
            .map_err(|e| Invalid { path: e.instance_path().to_string(), reason: e.to_string() })
    }

    pub(super) fn reads(&self, writer: &Json) -> Vec<Problem> {
        let mut out = Vec::new();
        reads(&self.schema, &writer.schema, "", &mut out);
        out
    }
}

pub(super) fn canonical(v: &Value, out: &mut String) {
    match v {
        Value::Object(m) => {
            out.push('{');
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            for (i, k) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(k.clone()).to_string());
                out.push(':');
                canonical(&m[k], out);
            }
            out.push('}');
        }
        Value::Array(a) => {
            out.push('[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                canonical(x, out);
            }
            out.push(']');
        }
        other => out.push_str(&other.to_string()),
    }
}

/// Keywords that only annotate: they never change what is accepted.
const ANNOTATIONS: &[&str] = &[
    "$schema",
    "$id",
    "$comment",
    "title",
    "description",
    "default",
    "examples",
    "deprecated",
    "readOnly",
    "writeOnly",
];

/// Keywords the rules below model.
const MODELLED: &[&str] = &[
    "type",
    "enum",
    "const",
    "properties",
    "patternProperties",
    "required",
    "additionalProperties",
    "items",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "minLength",
    "maxLength",
    "minItems",
    "maxItems",
    "minProperties",
    "maxProperties",
    "not",
    "pattern",
    "multipleOf",
    "uniqueItems",
    "dependencies",
];

/// `s` without `key`, and the subschemas `key` holds (none when absent or not a list).
fn split(s: &Map<String, Value>, key: &str) -> Option<(Value, Vec<Value>)> {
    let subs = s.get(key)?.as_array()?.clone();
    let mut rest = s.clone();
    rest.remove(key);
    Some((Value::Object(rest), subs))
}

/// Takes a combinator of either version apart (Confluent's sum and product types), the one
/// whose reading holds whatever the other side is first; `None` when neither has one.
/// Subschemas are matched by what they accept, not by their place. A reader's `oneOf` is taken
/// as Confluent takes it, as an `anyOf`: a writer's value two of its subschemas accept is not
/// looked for.
fn combined(r: &Map<String, Value>, w: &Map<String, Value>, path: &str, out: &mut Vec<Problem>) -> Option<()> {
    let (reader, writer) = (Value::Object(r.clone()), Value::Object(w.clone()));
    // The reader's allOf: the rest and each subschema read the writer.
    if let Some((rest, subs)) = split(r, "allOf") {
        reads(&rest, &writer, path, out);
        for (i, sub) in subs.iter().enumerate() {
            reads(sub, &writer, &format!("{path}/allOf/{i}"), out);
        }
        return Some(());
    }
    // The writer's anyOf/oneOf: what any subschema (with the rest) accepts is read.
    for key in ["anyOf", "oneOf"] {
        if let Some((rest, subs)) = split(w, key) {
            for (i, sub) in subs.iter().enumerate() {
                reads_any(&reader, &[&rest, sub], &format!("{path}/{key}/{i}"), out);
            }
            return Some(());
        }
    }
    // The writer's allOf: what all accept is read where one of them is.
    if let Some((rest, subs)) = split(w, "allOf") {
        let all: Vec<&Value> = std::iter::once(&rest).chain(&subs).collect();
        reads_any(&reader, &all, path, out);
        return Some(());
    }
    // The reader's anyOf/oneOf: the rest reads the writer, and some subschema does.
    for key in ["anyOf", "oneOf"] {
        if let Some((rest, subs)) = split(r, key) {
            reads(&rest, &writer, path, out);
            let mut first = None;
            for sub in &subs {
                let mut found = Vec::new();
                reads(sub, &writer, path, &mut found);
                if found.is_empty() {
                    return Some(());
                }
                first.get_or_insert(found);
            }
            let none = || vec![problem(path, "sum type narrowed", format!("`{key}` has no subschema"))];
            out.extend(first.unwrap_or_else(none));
            return Some(());
        }
    }
    None
}

/// `not`, `pattern`, `multipleOf`, `uniqueItems` and `dependencies`: what the reader adds or
/// tightens refuses what the writer took; what it drops or loosens does not.
fn refinements(r: &Map<String, Value>, w: &Map<String, Value>, path: &str, out: &mut Vec<Problem>) {
    if let Some(rn) = r.get("not") {
        match w.get("not") {
            // The reader excludes less than the writer did: what it excludes, the writer did.
            Some(wn) => reads(wn, rn, &format!("{path}/not"), out),
            None => out.push(problem(path, "not added", "values it excludes were accepted")),
        }
    }
    if let Some(rp) = r.get("pattern")
        && w.get("pattern") != Some(rp)
    {
        out.push(problem(path, "pattern added or changed", format!("strings not matching {rp} were accepted")));
    }
    if let Some(rm) = r.get("multipleOf").and_then(Value::as_f64) {
        let divides = w.get("multipleOf").and_then(Value::as_f64).is_some_and(|wm| (wm / rm).fract() == 0.0);
        if !divides {
            out.push(problem(
                path,
                "multipleOf added or changed",
                format!("numbers not a multiple of {rm} were accepted"),
            ));
        }
    }
    if r.get("uniqueItems") == Some(&Value::Bool(true)) && w.get("uniqueItems") != Some(&Value::Bool(true)) {
        out.push(problem(path, "uniqueItems added", "arrays with repeated items were accepted"));
    }
    let deps = |s: &Map<String, Value>| s.get("dependencies").and_then(Value::as_object).cloned().unwrap_or_default();
    let wd = deps(w);
    for (name, rd) in deps(r) {
        if wd.get(&name) != Some(&rd) {
            out.push(problem(&join(path, &name), "dependency added or changed", "objects without it were accepted"));
        }
    }
}

const TYPES: [&str; 7] = ["null", "boolean", "object", "array", "number", "string", "integer"];

/// The types a schema allows (`integer` stands for itself; `number` includes it).
fn types(s: &Map<String, Value>) -> Vec<&str> {
    match s.get("type") {
        Some(Value::String(t)) => vec![t.as_str()],
        Some(Value::Array(a)) => a.iter().filter_map(Value::as_str).collect(),
        _ => TYPES.to_vec(),
    }
}

fn allows(types: &[&str], t: &str) -> bool {
    types.contains(&t) || (t == "integer" && types.contains(&"number"))
}

fn values(s: &Map<String, Value>) -> Option<Vec<&Value>> {
    match (s.get("enum"), s.get("const")) {
        (_, Some(c)) => Some(vec![c]),
        (Some(Value::Array(a)), None) => Some(a.iter().collect()),
        _ => None,
    }
}

fn join(path: &str, key: &str) -> String {
    format!("{path}/{}", key.replace('~', "~0").replace('/', "~1"))
}

fn reads(reader: &Value, writer: &Value, path: &str, out: &mut Vec<Problem>) {
    if reader == writer {
        return;
    }
    let (r, w) = match (reader, writer) {
        (_, Value::Bool(false)) | (Value::Bool(true), _) => return,
        (Value::Bool(false), _) => return out.push(problem(path, "narrowed to nothing", "the new schema is `false`")),
        (Value::Object(r), Value::Bool(true)) => {
            if r.keys().all(|k| ANNOTATIONS.contains(&k.as_str())) {
                return;
            }
            return out.push(problem(path, "constrained", "the other version accepted any value here"));
        }
        (Value::Object(r), Value::Object(w)) => (r, w),
        _ => return out.push(problem(path, "not a schema", "a schema is an object or a boolean")),
    };
    if combined(r, w, path, out).is_some() {
        return;
    }
    refinements(r, w, path, out);
    for (k, rv) in r {
        if !ANNOTATIONS.contains(&k.as_str()) && !MODELLED.contains(&k.as_str()) && w.get(k) != Some(rv) {
            out.push(problem(path, "keyword not checked", format!("`{k}` differs; only identical values are taken")));
        }
    }
    for k in w.keys() {
        if !ANNOTATIONS.contains(&k.as_str()) && !MODELLED.contains(&k.as_str()) && !r.contains_key(k) {
            out.push(problem(path, "keyword not checked", format!("`{k}` differs; only identical values are taken")));
        }
    }
    let (rt, wt) = (types(r), types(w));
    let lost: Vec<&str> = wt.iter().copied().filter(|t| !allows(&rt, t)).collect();
    if !lost.is_empty() {
        out.push(problem(path, "type narrowed", format!("{} no longer accepted", lost.join(", "))));
    }
    if let Some(rv) = values(r) {
        match values(w) {
            Some(wv) => {
                let gone: Vec<String> = wv.iter().filter(|v| !rv.contains(v)).map(|v| v.to_string()).collect();
                if !gone.is_empty() {
                    out.push(problem(path, "enum narrowed", format!("{} no longer accepted", gone.join(", "))));
                }
            }
            None => out.push(problem(path, "enum added", "values outside the enum were accepted")),
        }
    }
    bounds(r, w, path, out);
    if wt.contains(&"object") && rt.contains(&"object") {
        objects(r, w, path, out);
    }
    if wt.contains(&"array") && rt.contains(&"array") {
        static TRUE: Value = Value::Bool(true);
        let (ri, wi) = (r.get("items").unwrap_or(&TRUE), w.get("items").unwrap_or(&TRUE));
        reads(ri, wi, &format!("{path}/items"), out);
    }
}

fn bounds(r: &Map<String, Value>, w: &Map<String, Value>, path: &str, out: &mut Vec<Problem>) {
    // A reader's lower bound above the writer's, or upper bound below it, refuses what was taken.
    const LOWER: [&str; 5] = ["minimum", "exclusiveMinimum", "minLength", "minItems", "minProperties"];
    const UPPER: [&str; 5] = ["maximum", "exclusiveMaximum", "maxLength", "maxItems", "maxProperties"];
    for k in LOWER {
        if let Some(rb) = r.get(k).and_then(Value::as_f64) {
            match w.get(k).and_then(Value::as_f64) {
                Some(wb) if wb >= rb => {}
                Some(wb) => out.push(problem(path, "bound tightened", format!("{k} raised from {wb} to {rb}"))),
                None => out.push(problem(path, "bound added", format!("{k} {rb}"))),
            }
        }
    }
    for k in UPPER {
        if let Some(rb) = r.get(k).and_then(Value::as_f64) {
            match w.get(k).and_then(Value::as_f64) {
                Some(wb) if wb <= rb => {}
                Some(wb) => out.push(problem(path, "bound tightened", format!("{k} lowered from {wb} to {rb}"))),
                None => out.push(problem(path, "bound added", format!("{k} {rb}"))),
            }
        }
    }
}

/// Every schema a property `name` must match under `s`: its entry in `properties` and each
/// `patternProperties` entry whose pattern matches it; `additionalProperties` (absent: anything)
/// when none does. A pattern that does not compile is taken to match (the stricter reading).
fn applying<'a>(s: &'a Map<String, Value>, name: &str) -> Vec<&'a Value> {
    static TRUE: Value = Value::Bool(true);
    let mut out: Vec<&Value> = s.get("properties").and_then(|p| p.get(name)).into_iter().collect();
    for (pattern, schema) in patterns(s) {
        if regex::Regex::new(pattern).map_or(true, |re| re.is_match(name)) {
            out.push(schema);
        }
    }
    if out.is_empty() {
        out.push(s.get("additionalProperties").unwrap_or(&TRUE));
    }
    out
}

fn patterns(s: &Map<String, Value>) -> impl Iterator<Item = (&String, &Value)> {
    s.get("patternProperties").and_then(Value::as_object).into_iter().flatten()
}

fn is_any(v: &Value) -> bool {
    v == &Value::Bool(true) || v.as_object().is_some_and(|o| o.keys().all(|k| ANNOTATIONS.contains(&k.as_str())))
}

/// Whether values the writer's schemas `w` all accept are accepted by `r`: some one of them
/// reads into it (their intersection is narrower still). The problems against the first when
/// none does.
fn reads_any(r: &Value, w: &[&Value], p: &str, out: &mut Vec<Problem>) {
    let mut first = None;
    for wv in w {
        let mut found = Vec::new();
        reads(r, wv, p, &mut found);
        if found.is_empty() {
            return;
        }
        first.get_or_insert(found);
    }
    out.extend(first.unwrap_or_default());
}

fn objects(r: &Map<String, Value>, w: &Map<String, Value>, path: &str, out: &mut Vec<Problem>) {
    let required = |s: &Map<String, Value>| -> Vec<String> {
        s.get("required")
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(|v| v.as_str().map(str::to_owned)).collect())
            .unwrap_or_default()
    };
    let (rr, wr) = (required(r), required(w));
    for name in rr.iter().filter(|n| !wr.contains(n)) {
        out.push(problem(&join(path, name), "required property added", format!("`{name}` could be absent before")));
    }
    let names = |s: &Map<String, Value>| -> Vec<String> {
        s.get("properties").and_then(Value::as_object).map(|p| p.keys().cloned().collect()).unwrap_or_default()
    };
    let mut all = names(r);
    all.extend(names(w));
    all.sort();
    all.dedup();
    // Each named property: what the writer accepted under it (its entry, the patterns it
    // matches, or the writer's additionalProperties) must pass every schema the reader applies.
    for name in &all {
        let p = join(path, name);
        let (rs, ws) = (applying(r, name), applying(w, name));
        if ws.iter().any(|v| **v == Value::Bool(false)) {
            continue;
        }
        for rv in rs.into_iter().filter(|v| !is_any(v)) {
            if ws.iter().all(|v| is_any(v)) {
                let rule = if *rv == Value::Bool(false) {
                    "property removed from a closed content model"
                } else {
                    "property added to an open content model"
                };
                out.push(problem(&p, rule, "any value was accepted here"));
            } else if *rv == Value::Bool(false) {
                out.push(problem(&p, "property removed from a closed content model", format!("`{name}` was accepted")));
            } else {
                reads_any(rv, &ws, &p, out);
            }
        }
    }
    // Names no `properties` lists, under patterns: a reader pattern against the writer's same
    // pattern, else against everything the writer took such names under (its other patterns
    // and additionalProperties: which names two patterns share is not worked out, the
    // stricter reading); a writer's pattern the reader dropped against the reader's
    // additionalProperties.
    static TRUE: Value = Value::Bool(true);
    let (ra, wa) = (r.get("additionalProperties").unwrap_or(&TRUE), w.get("additionalProperties").unwrap_or(&TRUE));
    for (pattern, rp) in patterns(r) {
        let p = format!("{path}/patternProperties/{pattern}");
        match w.get("patternProperties").and_then(|wp| wp.get(pattern)) {
            Some(wp) => reads(rp, wp, &p, out),
            None => {
                for (_, wp) in patterns(w) {
                    reads(rp, wp, &p, out);
                }
                if wa != &Value::Bool(false) {
                    reads(rp, wa, &p, out);
                }
            }
        }
    }
    let rpat = r.get("patternProperties").and_then(Value::as_object);
    for (pattern, wp) in patterns(w) {
        if rpat.is_some_and(|rp| rp.contains_key(pattern)) || *wp == Value::Bool(false) {
            continue;
        }
        let p = format!("{path}/patternProperties/{pattern}");
        if ra == &Value::Bool(false) {
            out.push(problem(
                &p,
                "pattern property removed from a closed content model",
                "names it matches were accepted",
            ));
        } else {
            reads(ra, wp, &p, out);
        }
    }
    if ra == &Value::Bool(false) && wa != &Value::Bool(false) {
        out.push(problem(path, "additional properties narrowed", "other property names were accepted"));
    } else {
        reads(ra, wa, &format!("{path}/additionalProperties"), out);
    }
}

#[cfg(test)]
#[path = "json_compat_tests.rs"]
mod compat_tests;
