//! JSON Schema compatibility case by case: Confluent's documented rules for open and closed
//! content models, `patternProperties`, `required`, numeric ranges and `enum`; each case names
//! its rule. Reader and writer as the registry checks them: the reader must accept every value
//! the writer accepts.

use super::*;

fn json(text: &str) -> Json {
    Json::parse(text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

/// An object schema with these `properties`, closed unless `open`, with `extra` keywords.
fn obj(props: &str, open: bool, extra: &str) -> String {
    let closed = if open { "" } else { r#","additionalProperties":false"# };
    format!(r#"{{"type":"object","properties":{{{props}}}{closed}{extra}}}"#)
}

/// (the rule, writer, reader, whether the reader accepts all the writer accepts)
fn cases() -> Vec<(&'static str, String, String, bool)> {
    let num = r#""a":{"type":"number"}"#;
    let int = r#""a":{"type":"integer"}"#;
    let s = r#""a":{"type":"string"}"#;
    let two = r#""a":{"type":"string"},"b":{"type":"string"}"#;
    let pat = |schema: &str| format!(r#","patternProperties":{{"^x_":{schema}}}"#);
    vec![
        ("same schema", obj(num, false, ""), obj(num, false, ""), true),
        ("type widened: integer read as number", obj(int, false, ""), obj(num, false, ""), true),
        ("type narrowed: number read as integer", obj(num, false, ""), obj(int, false, ""), false),
        ("type changed", obj(num, false, ""), obj(s, false, ""), false),
        ("type union widened", r#"{"type":"string"}"#.into(), r#"{"type":["string","null"]}"#.into(), true),
        ("type union narrowed", r#"{"type":["string","null"]}"#.into(), r#"{"type":"string"}"#.into(), false),
        ("closed: property added", obj(s, false, ""), obj(two, false, ""), true),
        ("closed: property removed", obj(two, false, ""), obj(s, false, ""), false),
        ("open: property added", obj(s, true, ""), obj(two, true, ""), false),
        ("open: property removed", obj(two, true, ""), obj(s, true, ""), true),
        ("open: property added as anything", obj(s, true, ""), obj(r#""a":{"type":"string"},"b":{}"#, true, ""), true),
        ("closed to open", obj(s, false, ""), obj(s, true, ""), true),
        ("open to closed", obj(s, true, ""), obj(s, false, ""), false),
        ("required added", obj(two, false, ""), obj(two, false, r#","required":["b"]"#), false),
        ("required removed", obj(two, false, r#","required":["b"]"#), obj(two, false, ""), true),
        ("minimum raised", r#"{"type":"number","minimum":0}"#.into(), r#"{"type":"number","minimum":5}"#.into(), false),
        ("minimum lowered", r#"{"type":"number","minimum":5}"#.into(), r#"{"type":"number","minimum":0}"#.into(), true),
        (
            "maximum lowered",
            r#"{"type":"number","maximum":10}"#.into(),
            r#"{"type":"number","maximum":5}"#.into(),
            false,
        ),
        ("maximum removed", r#"{"type":"number","maximum":10}"#.into(), r#"{"type":"number"}"#.into(), true),
        ("maximum added", r#"{"type":"number"}"#.into(), r#"{"type":"number","maximum":10}"#.into(), false),
        (
            "exclusiveMinimum raised",
            r#"{"type":"number","exclusiveMinimum":0}"#.into(),
            r#"{"type":"number","exclusiveMinimum":1}"#.into(),
            false,
        ),
        (
            "maxLength raised",
            r#"{"type":"string","maxLength":5}"#.into(),
            r#"{"type":"string","maxLength":9}"#.into(),
            true,
        ),
        (
            "minLength raised",
            r#"{"type":"string","minLength":1}"#.into(),
            r#"{"type":"string","minLength":2}"#.into(),
            false,
        ),
        (
            "maxItems lowered",
            r#"{"type":"array","maxItems":5}"#.into(),
            r#"{"type":"array","maxItems":3}"#.into(),
            false,
        ),
        (
            "maxProperties raised",
            r#"{"type":"object","maxProperties":3}"#.into(),
            r#"{"type":"object","maxProperties":4}"#.into(),
            true,
        ),
        ("enum widened", r#"{"enum":["C","F"]}"#.into(), r#"{"enum":["C","F","K"]}"#.into(), true),
        ("enum narrowed", r#"{"enum":["C","F"]}"#.into(), r#"{"enum":["C"]}"#.into(), false),
        ("enum added", r#"{"type":"string"}"#.into(), r#"{"type":"string","enum":["C"]}"#.into(), false),
        ("enum removed", r#"{"type":"string","enum":["C"]}"#.into(), r#"{"type":"string"}"#.into(), true),
        ("const to an enum holding it", r#"{"const":"C"}"#.into(), r#"{"enum":["C","F"]}"#.into(), true),
        (
            "array items widened",
            r#"{"type":"array","items":{"type":"integer"}}"#.into(),
            r#"{"type":"array","items":{"type":"number"}}"#.into(),
            true,
        ),
        (
            "array items narrowed",
            r#"{"type":"array","items":{"type":"number"}}"#.into(),
            r#"{"type":"array","items":{"type":"integer"}}"#.into(),
            false,
        ),
        (
            "nested property narrowed",
            obj(r#""o":{"type":"object","properties":{"v":{"type":"number"}}}"#, false, ""),
            obj(r#""o":{"type":"object","properties":{"v":{"type":"integer"}}}"#, false, ""),
            false,
        ),
        (
            "a description changed",
            r#"{"type":"string","description":"a"}"#.into(),
            r#"{"type":"string","description":"b"}"#.into(),
            true,
        ),
        (
            "an unmodelled keyword changed",
            r#"{"type":"string","format":"date"}"#.into(),
            r#"{"type":"string","format":"email"}"#.into(),
            false,
        ),
        ("reader false", r#"{"type":"string"}"#.into(), "false".into(), false),
        ("reader true", r#"{"type":"string"}"#.into(), "true".into(), true),
        // patternProperties (issue 45: changes behind an identical pattern in a closed model passed).
        (
            "closed: property added under an identical pattern, narrowed",
            obj(s, false, &pat(r#"{"type":"string"}"#)),
            obj(r#""a":{"type":"string"},"x_n":{"type":"integer"}"#, false, &pat(r#"{"type":"string"}"#)),
            false,
        ),
        (
            "closed: property added under an identical pattern, the same type",
            obj(s, false, &pat(r#"{"type":"string"}"#)),
            obj(r#""a":{"type":"string"},"x_n":{"type":"string"}"#, false, &pat(r#"{"type":"string"}"#)),
            true,
        ),
        (
            "closed: property not matching the pattern added",
            obj(s, false, &pat(r#"{"type":"string"}"#)),
            obj(r#""a":{"type":"string"},"y":{"type":"integer"}"#, false, &pat(r#"{"type":"string"}"#)),
            true,
        ),
        (
            "closed: property removed but still under a pattern",
            obj(r#""a":{"type":"string"},"x_n":{"type":"string"}"#, false, &pat(r#"{"type":"string"}"#)),
            obj(s, false, &pat(r#"{"type":"string"}"#)),
            true,
        ),
        (
            "closed: property removed to a narrower pattern",
            obj(r#""a":{"type":"string"},"x_n":{"type":"number"}"#, false, &pat(r#"{"type":"number"}"#)),
            obj(s, false, &pat(r#"{"type":"number","minimum":0}"#)),
            false,
        ),
        (
            "closed: a property's values were already narrowed by the pattern",
            obj(r#""a":{"type":"string"},"x_n":{"type":"number"}"#, false, &pat(r#"{"type":"integer"}"#)),
            obj(s, false, &pat(r#"{"type":"integer"}"#)),
            true,
        ),
        (
            "pattern schema widened",
            obj(s, false, &pat(r#"{"type":"integer"}"#)),
            obj(s, false, &pat(r#"{"type":"number"}"#)),
            true,
        ),
        (
            "pattern schema narrowed",
            obj(s, false, &pat(r#"{"type":"number"}"#)),
            obj(s, false, &pat(r#"{"type":"integer"}"#)),
            false,
        ),
        ("closed: pattern removed", obj(s, false, &pat(r#"{"type":"string"}"#)), obj(s, false, ""), false),
        ("closed: pattern added", obj(s, false, ""), obj(s, false, &pat(r#"{"type":"string"}"#)), true),
        ("open: pattern added", obj(s, true, ""), obj(s, true, &pat(r#"{"type":"string"}"#)), false),
        ("open: pattern removed", obj(s, true, &pat(r#"{"type":"string"}"#)), obj(s, true, ""), true),
        // Combinators as Confluent's sum and product types; subschemas matched by content.
        ("oneOf: subschemas reordered", one("oneOf", &[STR, NUM]), one("oneOf", &[NUM, STR]), true),
        ("oneOf extended (sum type extended)", one("oneOf", &[STR]), one("oneOf", &[STR, NUM]), true),
        ("oneOf narrowed (sum type narrowed)", one("oneOf", &[STR, NUM]), one("oneOf", &[STR]), false),
        ("anyOf extended", one("anyOf", &[STR]), one("anyOf", &[STR, NUM]), true),
        ("allOf narrowed to fewer (product type narrowed)", one("allOf", &[STR, MAX5]), one("allOf", &[STR]), true),
        ("allOf extended (product type extended)", one("allOf", &[STR]), one("allOf", &[STR, MAX5]), false),
        ("oneOf to anyOf (combined type extended)", one("oneOf", &[STR, NUM]), one("anyOf", &[STR, NUM]), true),
        ("allOf to anyOf", one("allOf", &[STR, MAX5]), one("anyOf", &[STR, MAX5]), true),
        ("anyOf to allOf with the same subschemas", one("anyOf", &[STR, NUM]), one("allOf", &[STR, NUM]), false),
        ("a schema to a oneOf holding it", STR.into(), one("oneOf", &[STR, NUM]), true),
        ("a oneOf to one of its subschemas", one("oneOf", &[STR, NUM]), STR.into(), false),
        (
            "a subschema's bound loosened",
            one("oneOf", &[MAX5, NUM]),
            one("oneOf", &[r#"{"type":"string","maxLength":9}"#, NUM]),
            true,
        ),
        (
            "a subschema's bound tightened",
            one("oneOf", &[r#"{"type":"string","maxLength":9}"#]),
            one("oneOf", &[MAX5]),
            false,
        ),
        (
            "closed: property removed, covered by additionalProperties through a oneOf",
            obj(two, false, ""),
            obj(s, true, r#","additionalProperties":{"oneOf":[{"type":"null"},{"type":"string"}]}"#),
            true,
        ),
        (
            "closed: property removed, not covered by additionalProperties through a oneOf",
            obj(two, false, ""),
            obj(s, true, r#","additionalProperties":{"oneOf":[{"type":"null"},{"type":"number"}]}"#),
            false,
        ),
        // `not`: the excluded set may only shrink.
        ("not narrowed", r#"{"not":{"type":["string","number"]}}"#.into(), r#"{"not":{"type":"string"}}"#.into(), true),
        ("not widened", r#"{"not":{"type":"string"}}"#.into(), r#"{"not":{"type":["string","number"]}}"#.into(), false),
        ("not added", STR.into(), r#"{"type":"string","not":{"maxLength":0}}"#.into(), false),
        // Refinements: dropping one accepts more; adding or tightening one, less.
        ("pattern removed", r#"{"type":"string","pattern":"^a"}"#.into(), STR.into(), true),
        ("pattern added", STR.into(), r#"{"type":"string","pattern":"^a"}"#.into(), false),
        ("multipleOf removed", r#"{"type":"number","multipleOf":10}"#.into(), NUM.into(), true),
        (
            "multipleOf divided (10 to 5)",
            r#"{"type":"number","multipleOf":10}"#.into(),
            r#"{"type":"number","multipleOf":5}"#.into(),
            true,
        ),
        (
            "multipleOf not dividing (10 to 3)",
            r#"{"type":"number","multipleOf":10}"#.into(),
            r#"{"type":"number","multipleOf":3}"#.into(),
            false,
        ),
        ("uniqueItems removed", r#"{"type":"array","uniqueItems":true}"#.into(), r#"{"type":"array"}"#.into(), true),
        ("uniqueItems added", r#"{"type":"array"}"#.into(), r#"{"type":"array","uniqueItems":true}"#.into(), false),
        ("dependency removed", r#"{"dependencies":{"a":["b"]}}"#.into(), "{}".into(), true),
        ("dependency added", "{}".into(), r#"{"dependencies":{"a":["b"]}}"#.into(), false),
        // Stricter than Confluent's list, which takes a required name the reader adds as harmless
        // when no property declares it: an old document without it fails the new schema.
        (
            "required name changed (Confluent: compatible)",
            obj(s, true, r#","required":["a"]"#),
            obj(s, true, r#","required":["b"]"#),
            false,
        ),
    ]
}

const STR: &str = r#"{"type":"string"}"#;
const NUM: &str = r#"{"type":"number"}"#;
const MAX5: &str = r#"{"type":"string","maxLength":5}"#;

/// `{"<key>": [subs...]}`.
fn one(key: &str, subs: &[&str]) -> String {
    format!(r#"{{"{key}":[{}]}}"#, subs.join(","))
}

#[test]
fn the_rules_case_by_case() {
    for (rule, writer, reader, readable) in cases() {
        let problems = json(&reader).reads(&json(&writer));
        assert_eq!(problems.is_empty(), readable, "{rule}: {problems:?}");
    }
}
