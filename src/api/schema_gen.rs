//! A JSON value valid against a JSON Schema, made up from a seed: the synthetic output of
//! `response_format` `json_schema`, vLLM's `guided_json`, and tool-call arguments.
//!
//! Covers what function and response schemas use: `type` (one or a list), `enum`, `const`,
//! `properties` / `required` / `additionalProperties`, `items` / `prefixItems` and their
//! counts, numeric bounds and `multipleOf` for integers, string lengths and the common
//! `format`s, `anyOf` (the first alternative abe can satisfy), `oneOf` (the first alternative
//! whose output provably fails every other one, see [`excludes`]; none is a 400), `allOf` of object
//! schemas, local `$ref`s (`#/$defs/..`, `#/definitions/..`), booleans as schemas. What it
//! cannot satisfy (a `pattern`, a contradiction such as `minimum` > `maximum`, a `false`
//! schema, an unknown `type`, refs nested past a bound) is an error naming the schema path,
//! answered as a 400. Tests check the outputs with the `jsonschema` crate, not here.
//!
//! What must never happen here: an output abe did not check it could produce (an unsupported
//! keyword that constrains values is refused, not ignored), unbounded recursion, or a draw
//! that is not from the caller's seed.

use serde_json::{Map, Value};

/// Why a schema cannot be satisfied by abe's synthetic output.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unsatisfiable {
    /// Where in the schema, as a JSON pointer (`#/properties/city`).
    pub at: String,
    pub why: String,
}

impl std::fmt::Display for Unsatisfiable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "abe cannot produce output for the schema at {}: {}",
            self.at, self.why
        )
    }
}

/// Deepest nesting (objects, arrays, refs) followed; past it the schema is refused.
const DEPTH_MAX: u32 = 16;

/// Past this depth only required properties are written.
const OPTIONAL_DEPTH_MAX: u32 = 4;

/// Most values (objects, arrays, strings, numbers...) one answer holds: nesting multiplies
/// (`minItems` 64 at each of 16 levels, or a `$ref` back to itself), so the walk is bounded
/// by count, not only by depth. The generator runs on an io thread, on client input.
const VALUES_MAX: u32 = 4_096;

/// Most bytes of strings one answer holds (`minLength` adds up over the values).
const STRING_BYTES_MAX: usize = 1 << 20;

/// Most extra properties `minProperties` makes abe write (as `minItems` for arrays).
const MIN_PROPERTIES_MAX: u64 = 64;

/// Words string values are made of.
const WORDS: [&str; 16] = [
    "amber", "river", "stone", "north", "quiet", "lamp", "cedar", "harbor", "ember", "maple",
    "signal", "orbit", "meadow", "copper", "willow", "delta",
];

/// splitmix64: a tiny, seedable draw.
#[derive(Clone, Debug)]
pub struct Draw(u64);

impl Draw {
    pub fn new(seed: u64) -> Draw {
        Draw(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..=hi` (`lo <= hi`).
    pub fn range(&mut self, lo: i64, hi: i64) -> i64 {
        debug_assert!(lo <= hi);
        let span = (hi as i128 - lo as i128 + 1) as u128;
        (lo as i128 + (u128::from(self.next_u64()) % span) as i128) as i64
    }

    pub fn pick<'a, T>(&mut self, xs: &'a [T]) -> &'a T {
        &xs[(self.next_u64() % xs.len() as u64) as usize]
    }
}

/// A value valid against `schema` (the root, for `$ref`s), drawn from `draw`.
pub fn generate(schema: &Value, draw: &mut Draw) -> Result<Value, Unsatisfiable> {
    Gen {
        root: schema,
        draw,
        values_left: VALUES_MAX,
        bytes_left: STRING_BYTES_MAX,
    }
    .value(schema, "#", 0)
}

struct Gen<'a, 'd> {
    root: &'a Value,
    draw: &'d mut Draw,
    /// Values still allowed in this answer ([`VALUES_MAX`]).
    values_left: u32,
    /// String bytes still allowed in this answer ([`STRING_BYTES_MAX`]).
    bytes_left: usize,
}

fn no(at: &str, why: impl Into<String>) -> Unsatisfiable {
    Unsatisfiable {
        at: at.to_string(),
        why: why.into(),
    }
}

/// Keywords that constrain values and that this generator does not honour.
const REFUSED: [&str; 8] = [
    "pattern",
    "patternProperties",
    "not",
    "if",
    "contains",
    "dependentSchemas",
    "dependentRequired",
    "propertyNames",
];

impl<'a> Gen<'a, '_> {
    fn value(&mut self, s: &Value, at: &str, depth: u32) -> Result<Value, Unsatisfiable> {
        if depth > DEPTH_MAX {
            return Err(no(at, format!("nested deeper than {DEPTH_MAX} levels")));
        }
        if self.values_left == 0 {
            return Err(no(
                at,
                format!("the schema asks for more than abe writes ({VALUES_MAX} values)"),
            ));
        }
        self.values_left -= 1;
        let obj = match s {
            Value::Bool(true) => return Ok(Value::Object(Map::new())),
            Value::Bool(false) => return Err(no(at, "the schema `false` accepts nothing")),
            Value::Object(o) => o,
            _ => return Err(no(at, "a schema must be an object or a boolean")),
        };
        if let Some(r) = obj.get("$ref") {
            let target = self.resolve(r, at)?;
            return self.value(target, &format!("{at}/$ref"), depth + 1);
        }
        for k in REFUSED {
            if obj.contains_key(k) {
                return Err(no(
                    at,
                    format!("'{k}' is not supported by abe's synthetic output"),
                ));
            }
        }
        if let Some(c) = obj.get("const") {
            return Ok(c.clone());
        }
        if let Some(e) = obj.get("enum") {
            let options = e.as_array().filter(|a| !a.is_empty());
            let options = options.ok_or_else(|| no(at, "'enum' must be a non-empty array"))?;
            return Ok(self.draw.pick(options).clone());
        }
        if let Some(alts) = obj.get("anyOf") {
            return self.first_of(alts, &format!("{at}/anyOf"), depth);
        }
        if let Some(alts) = obj.get("oneOf") {
            return self.one_of(alts, &format!("{at}/oneOf"), depth);
        }
        if let Some(all) = obj.get("allOf") {
            let merged = merge_all_of(obj, all).map_err(|why| no(&format!("{at}/allOf"), why))?;
            return self.value(&merged, at, depth + 1);
        }
        let ty = match obj.get("type") {
            None if obj.contains_key("properties") => "object",
            None if obj.contains_key("items") => "array",
            None => "string",
            Some(Value::String(t)) => t.as_str(),
            Some(Value::Array(ts)) => {
                // The first listed type that is not null (null only if alone).
                let named: Vec<&str> = ts.iter().filter_map(Value::as_str).collect();
                *named
                    .iter()
                    .find(|t| **t != "null")
                    .or(named.first())
                    .ok_or_else(|| no(at, "'type' must name at least one type"))?
            }
            Some(_) => return Err(no(at, "'type' must be a string or a list of strings")),
        };
        match ty {
            "object" => self.object(obj, at, depth),
            "array" => self.array(obj, at, depth),
            "string" => self.string(obj, at),
            "integer" => self.integer(obj, at).map(Value::from),
            "number" => self.number(obj, at),
            "boolean" => Ok(Value::Bool(self.draw.next_u64() & 1 == 1)),
            "null" => Ok(Value::Null),
            other => Err(no(at, format!("unknown type '{other}'"))),
        }
    }

    fn resolve(&self, r: &Value, at: &str) -> Result<&'a Value, Unsatisfiable> {
        let r = r
            .as_str()
            .ok_or_else(|| no(at, "'$ref' must be a string"))?;
        let pointer = r.strip_prefix('#').ok_or_else(|| {
            no(
                at,
                format!("only local '$ref's (#/...) are supported, not '{r}'"),
            )
        })?;
        self.root
            .pointer(pointer)
            .ok_or_else(|| no(at, format!("'$ref' {r} points at nothing")))
    }

    fn first_of(&mut self, alts: &Value, at: &str, depth: u32) -> Result<Value, Unsatisfiable> {
        let alts = alternatives(alts, at)?;
        let mut last = None;
        for (i, alt) in alts.iter().enumerate() {
            match self.value(alt, &format!("{at}/{i}"), depth + 1) {
                Ok(v) => return Ok(v),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| no(at, "no alternative")))
    }

    /// `oneOf`: valid only when exactly one alternative matches, so each alternative's
    /// output is kept only if it provably fails every other alternative ([`excludes`]:
    /// conservative, it never claims a failure it did not see); the first such is the answer.
    fn one_of(&mut self, alts: &Value, at: &str, depth: u32) -> Result<Value, Unsatisfiable> {
        let alts = alternatives(alts, at)?;
        let mut last = None;
        for (i, alt) in alts.iter().enumerate() {
            match self.value(alt, &format!("{at}/{i}"), depth + 1) {
                Ok(v) => {
                    let mut others = alts.iter().enumerate().filter(|(j, _)| *j != i);
                    if others.all(|(_, other)| excludes(self.root, other, &v, 0)) {
                        return Ok(v);
                    }
                }
                Err(e) => last = Some(e),
            }
        }
        Err(match last {
            Some(e) if alts.len() == 1 => e,
            _ => no(
                at,
                "abe cannot make output that matches exactly one alternative \
                 (each one it can produce may also match another)",
            ),
        })
    }

    fn object(
        &mut self,
        o: &Map<String, Value>,
        at: &str,
        depth: u32,
    ) -> Result<Value, Unsatisfiable> {
        let empty = Map::new();
        let props = match o.get("properties") {
            None => &empty,
            Some(Value::Object(p)) => p,
            Some(_) => return Err(no(at, "'properties' must be an object")),
        };
        let required: Vec<&str> = match o.get("required") {
            None => Vec::new(),
            Some(Value::Array(r)) => r.iter().filter_map(Value::as_str).collect(),
            Some(_) => return Err(no(at, "'required' must be an array of names")),
        };
        let closed = o.get("additionalProperties") == Some(&Value::Bool(false));
        let mut out = Map::new();
        // Every declared property near the top (a fuller answer exercises more of a
        // client), only the required ones deeper (so a recursive schema ends), in the
        // schema's order.
        for (name, sub) in props {
            if depth >= OPTIONAL_DEPTH_MAX && !required.contains(&name.as_str()) {
                continue;
            }
            let v = self.value(sub, &format!("{at}/properties/{name}"), depth + 1)?;
            out.insert(name.clone(), v);
        }
        for name in required {
            if out.contains_key(name) {
                continue;
            }
            if closed {
                return Err(no(
                    at,
                    format!("'{name}' is required but not a property, and additionalProperties is false"),
                ));
            }
            let extra = match o.get("additionalProperties") {
                Some(s @ Value::Object(_)) => {
                    self.value(s, &format!("{at}/additionalProperties"), depth + 1)?
                }
                _ => Value::String(self.words(1)),
            };
            out.insert(name.to_string(), extra);
        }
        let min = count(o, "minProperties", at)?.unwrap_or(0);
        let max = count(o, "maxProperties", at)?.unwrap_or(u64::MAX);
        if min > MIN_PROPERTIES_MAX {
            return Err(no(
                at,
                format!("minProperties {min} is more than abe writes ({MIN_PROPERTIES_MAX})"),
            ));
        }
        if (out.len() as u64) > max {
            return Err(no(
                at,
                format!("{} properties exceed maxProperties {max}", out.len()),
            ));
        }
        let mut i = 0;
        while (out.len() as u64) < min {
            if closed {
                return Err(no(
                    at,
                    "minProperties needs properties additionalProperties forbids",
                ));
            }
            let extra = match o.get("additionalProperties") {
                Some(s @ Value::Object(_)) => {
                    self.value(s, &format!("{at}/additionalProperties"), depth + 1)?
                }
                _ => Value::String(self.words(1)),
            };
            out.insert(format!("extra_{i}"), extra);
            i += 1;
        }
        Ok(Value::Object(out))
    }

    fn array(
        &mut self,
        o: &Map<String, Value>,
        at: &str,
        depth: u32,
    ) -> Result<Value, Unsatisfiable> {
        let min = count(o, "minItems", at)?.unwrap_or(0);
        let max = count(o, "maxItems", at)?.unwrap_or(u64::MAX);
        if min > max {
            return Err(no(at, format!("minItems {min} > maxItems {max}")));
        }
        if min > 64 {
            return Err(no(
                at,
                format!("minItems {min} is more than abe writes (64)"),
            ));
        }
        let prefix: &[Value] = match o.get("prefixItems") {
            Some(Value::Array(p)) => p,
            _ => &[],
        };
        let want = (min.max(prefix.len() as u64).max(1))
            .min(max)
            .min(3.max(min)) as usize;
        let mut out = Vec::with_capacity(want);
        for i in 0..want {
            let v = match prefix.get(i) {
                Some(p) => self.value(p, &format!("{at}/prefixItems/{i}"), depth + 1)?,
                None => match o.get("items") {
                    Some(Value::Bool(false)) if i >= prefix.len() => break,
                    Some(items) => self.value(items, &format!("{at}/items"), depth + 1)?,
                    None => Value::String(self.words(1)),
                },
            };
            out.push(v);
        }
        if (out.len() as u64) < min {
            return Err(no(
                at,
                format!("minItems {min} but items allows only {}", out.len()),
            ));
        }
        if o.get("uniqueItems") == Some(&Value::Bool(true)) {
            let mut seen = Vec::new();
            for v in &out {
                if seen.contains(&v) {
                    return Err(no(at, "uniqueItems with items abe drew equal"));
                }
                seen.push(v);
            }
        }
        Ok(Value::Array(out))
    }

    fn words(&mut self, n: usize) -> String {
        let mut s = String::new();
        for i in 0..n {
            if i > 0 {
                s.push(' ');
            }
            let w: &&str = self.draw.pick(&WORDS[..]);
            s.push_str(w);
        }
        s
    }

    fn string(&mut self, o: &Map<String, Value>, at: &str) -> Result<Value, Unsatisfiable> {
        let min = count(o, "minLength", at)?.unwrap_or(0) as usize;
        let max = count(o, "maxLength", at)?.unwrap_or(u64::MAX).min(1 << 16) as usize;
        if min > max {
            return Err(no(at, format!("minLength {min} > maxLength {max}")));
        }
        if min > self.bytes_left {
            return Err(no(
                at,
                format!("the schema asks for more than abe writes ({STRING_BYTES_MAX} bytes of strings)"),
            ));
        }
        self.bytes_left -= min;
        let mut s = match o.get("format").and_then(Value::as_str) {
            Some("date-time") => format!(
                "2026-11-{:02}T{:02}:00:00Z",
                self.draw.range(1, 28),
                self.draw.range(0, 23)
            ),
            Some("date") => format!("2026-11-{:02}", self.draw.range(1, 28)),
            Some("time") => format!(
                "{:02}:{:02}:00Z",
                self.draw.range(0, 23),
                self.draw.range(0, 59)
            ),
            Some("email") => format!("{}@example.com", self.draw.pick(&WORDS)),
            Some("uri") | Some("url") => format!("https://example.com/{}", self.draw.pick(&WORDS)),
            Some("uuid") => {
                let (a, b) = (self.draw.next_u64(), self.draw.next_u64());
                format!(
                    "{:08x}-{:04x}-4{:03x}-8{:03x}-{:012x}",
                    a >> 32,
                    (a >> 16) & 0xffff,
                    a & 0xfff,
                    b >> 52,
                    b & 0xffff_ffff_ffff
                )
            }
            Some("ipv4") => format!(
                "10.0.{}.{}",
                self.draw.range(0, 255),
                self.draw.range(1, 254)
            ),
            _ => {
                let n = self.draw.range(1, 3) as usize;
                self.words(n)
            }
        };
        let formatted = o.contains_key("format");
        let chars = s.chars().count();
        if chars > max {
            if formatted {
                return Err(no(
                    at,
                    format!("maxLength {max} is shorter than its format"),
                ));
            }
            s = s.chars().take(max).collect();
        }
        while s.chars().count() < min {
            if formatted {
                return Err(no(at, format!("minLength {min} is longer than its format")));
            }
            s.push(if s.is_empty() { 'a' } else { 'x' });
        }
        Ok(Value::String(s))
    }

    fn bounds(
        &self,
        o: &Map<String, Value>,
        at: &str,
    ) -> Result<(f64, f64, bool, bool), Unsatisfiable> {
        let num = |k: &str| -> Result<Option<f64>, Unsatisfiable> {
            match o.get(k) {
                None => Ok(None),
                Some(v) => v
                    .as_f64()
                    .map(Some)
                    .ok_or_else(|| no(at, format!("'{k}' must be a number"))),
            }
        };
        let (mut lo, mut hi, mut lo_open, mut hi_open) = (-1e9, 1e9, false, false);
        if let Some(v) = num("minimum")? {
            lo = v;
        }
        if let Some(v) = num("maximum")? {
            hi = v;
        }
        if let Some(v) = num("exclusiveMinimum")? {
            if v >= lo {
                lo = v;
                lo_open = true;
            }
        }
        if let Some(v) = num("exclusiveMaximum")? {
            if v <= hi {
                hi = v;
                hi_open = true;
            }
        }
        if lo > hi || (lo == hi && (lo_open || hi_open)) {
            return Err(no(
                at,
                format!("no number lies between the bounds {lo} and {hi}"),
            ));
        }
        Ok((lo, hi, lo_open, hi_open))
    }

    fn integer(&mut self, o: &Map<String, Value>, at: &str) -> Result<i64, Unsatisfiable> {
        let (lo, hi, lo_open, hi_open) = self.bounds(o, at)?;
        let mut lo_i = if lo_open {
            lo.floor() as i64 + 1
        } else {
            lo.ceil() as i64
        };
        let mut hi_i = if hi_open {
            hi.ceil() as i64 - 1
        } else {
            hi.floor() as i64
        };
        // A small, readable range unless the schema asks otherwise.
        if o.get("minimum").is_none() && o.get("exclusiveMinimum").is_none() {
            lo_i = lo_i.max(hi_i.saturating_sub(100).min(0));
        }
        if o.get("maximum").is_none() && o.get("exclusiveMaximum").is_none() {
            hi_i = hi_i.min(lo_i.saturating_add(100).max(100));
        }
        let step = match o.get("multipleOf") {
            None => 1,
            Some(m) => match m.as_i64().filter(|m| *m > 0) {
                Some(m) => m,
                None => return Err(no(at, "'multipleOf' must be a positive integer here")),
            },
        };
        let first =
            lo_i.div_euclid(step) * step + if lo_i.rem_euclid(step) == 0 { 0 } else { step };
        if first > hi_i {
            return Err(no(
                at,
                format!("no multiple of {step} lies in {lo_i}..={hi_i}"),
            ));
        }
        let steps = (hi_i - first) / step;
        Ok(first + self.draw.range(0, steps.min(1000)) * step)
    }

    fn number(&mut self, o: &Map<String, Value>, at: &str) -> Result<Value, Unsatisfiable> {
        if o.contains_key("multipleOf") {
            return self.integer(o, at).map(Value::from);
        }
        let (lo, hi, lo_open, hi_open) = self.bounds(o, at)?;
        let (lo, hi) = (lo.max(-1000.0), hi.min(1000.0));
        let (lo, hi) = if lo > hi { (hi, hi) } else { (lo, hi) };
        let t = (self.draw.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        let mut v = ((lo + (hi - lo) * t) * 100.0).round() / 100.0;
        if (lo_open && v <= lo) || v < lo || (hi_open && v >= hi) || v > hi {
            v = (lo + hi) / 2.0;
        }
        serde_json::Number::from_f64(v)
            .map(Value::Number)
            .ok_or_else(|| no(at, "bounds abe cannot write a number within"))
    }
}

/// True only when `v` certainly fails `schema` (`root` for its `$ref`s): a `false` schema,
/// a `type`, `const` or `enum` `v` does not meet, a required property `v` lacks, a property
/// a closed object forbids, or a property whose own schema it certainly fails. Anything it
/// cannot see (bounds, lengths, formats...) counts as "may match": `oneOf` relies on it
/// never saying true wrongly.
pub fn excludes(root: &Value, schema: &Value, v: &Value, depth: u32) -> bool {
    if depth > DEPTH_MAX {
        return false;
    }
    let o = match schema {
        Value::Bool(b) => return !b,
        Value::Object(o) => o,
        _ => return false,
    };
    if let Some(target) = o
        .get("$ref")
        .and_then(Value::as_str)
        .and_then(|r| r.strip_prefix('#'))
        .and_then(|p| root.pointer(p))
    {
        if excludes(root, target, v, depth + 1) {
            return true;
        }
    }
    let type_fails = |t: &Value| match t {
        Value::String(t) => !has_type(v, t),
        Value::Array(ts) => ts
            .iter()
            .all(|t| t.as_str().is_some_and(|t| !has_type(v, t))),
        _ => false,
    };
    if o.get("type").is_some_and(type_fails) {
        return true;
    }
    if o.get("const").is_some_and(|c| !json_eq(c, v)) {
        return true;
    }
    if let Some(Value::Array(options)) = o.get("enum") {
        if !options.iter().any(|e| json_eq(e, v)) {
            return true;
        }
    }
    let Value::Object(fields) = v else {
        return false;
    };
    if let Some(Value::Array(required)) = o.get("required") {
        if required
            .iter()
            .filter_map(Value::as_str)
            .any(|name| !fields.contains_key(name))
        {
            return true;
        }
    }
    let props = o.get("properties").and_then(Value::as_object);
    // Closed: a key outside `properties` fails it, unless `patternProperties` may allow it
    // (patterns are not matched here; not proven, so not excluded).
    if o.get("additionalProperties") == Some(&Value::Bool(false))
        && !o.contains_key("patternProperties")
        && fields
            .keys()
            .any(|k| !props.is_some_and(|p| p.contains_key(k)))
    {
        return true;
    }
    props.is_some_and(|p| {
        fields
            .iter()
            .any(|(k, fv)| p.get(k).is_some_and(|ps| excludes(root, ps, fv, depth + 1)))
    })
}

/// The alternatives of an `anyOf` / `oneOf` at `at`: a non-empty array of schemas.
fn alternatives<'v>(alts: &'v Value, at: &str) -> Result<&'v Vec<Value>, Unsatisfiable> {
    alts.as_array()
        .filter(|a| !a.is_empty())
        .ok_or_else(|| no(at, "must be a non-empty array of schemas"))
}

/// JSON Schema's type test: an integer is also a number, and a number with no fraction is
/// also an integer.
fn has_type(v: &Value, t: &str) -> bool {
    match (t, v) {
        ("null", Value::Null) | ("boolean", Value::Bool(_)) | ("string", Value::String(_)) => true,
        ("array", Value::Array(_))
        | ("object", Value::Object(_))
        | ("number", Value::Number(_)) => true,
        ("integer", Value::Number(n)) => {
            n.is_i64() || n.is_u64() || n.as_f64().is_some_and(|f| f.fract() == 0.0)
        }
        ("null" | "boolean" | "string" | "array" | "object" | "number" | "integer", _) => false,
        // A type abe does not know: it may match.
        _ => true,
    }
}

/// JSON Schema's equality: numbers by value (1 equals 1.0), the rest structurally.
fn json_eq(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x == y || x.as_f64() == y.as_f64(),
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(x, y)| json_eq(x, y))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, xv)| y.get(k).is_some_and(|yv| json_eq(xv, yv)))
        }
        _ => a == b,
    }
}

/// The non-negative integer `key` of `o`, if present.
fn count(o: &Map<String, Value>, key: &str, at: &str) -> Result<Option<u64>, Unsatisfiable> {
    match o.get(key) {
        None => Ok(None),
        Some(v) => v
            .as_u64()
            .map(Some)
            .ok_or_else(|| no(at, format!("'{key}' must be a non-negative integer"))),
    }
}

/// `allOf` of object schemas (and the schema around it) as one object schema: properties
/// and required lists joined; anything else in a part is refused.
fn merge_all_of(outer: &Map<String, Value>, all: &Value) -> Result<Value, String> {
    let parts = all.as_array().ok_or("must be an array of schemas")?;
    let mut props = Map::new();
    let mut required = Vec::new();
    let mut outer = outer.clone();
    outer.remove("allOf");
    for part in std::iter::once(&Value::Object(outer.clone())).chain(parts) {
        let Some(p) = part.as_object() else {
            return Err("only object schemas can be merged".into());
        };
        for (k, v) in p {
            match k.as_str() {
                "properties" => {
                    for (name, s) in v.as_object().ok_or("'properties' must be an object")? {
                        props.insert(name.clone(), s.clone());
                    }
                }
                "required" => required.extend(v.as_array().cloned().unwrap_or_default()),
                "type" if v == "object" => {}
                "description" | "title" | "$defs" | "definitions" | "additionalProperties" => {}
                other => return Err(format!("'{other}' inside allOf is not supported")),
            }
        }
    }
    Ok(serde_json::json!({ "type": "object", "properties": props, "required": required }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn gen(s: Value, seed: u64) -> Result<Value, Unsatisfiable> {
        generate(&s, &mut Draw::new(seed))
    }

    #[test]
    fn the_same_seed_makes_the_same_value_and_another_seed_another() {
        let s =
            json!({"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"string"}}});
        assert_eq!(gen(s.clone(), 1), gen(s.clone(), 1));
        assert!((2..10).any(|seed| gen(s.clone(), seed) != gen(s.clone(), 1)));
    }

    #[test]
    fn bounds_enums_refs_and_formats_are_honoured() {
        let s = json!({
            "$defs": {"unit": {"enum": ["celsius", "fahrenheit"]}},
            "type": "object",
            "properties": {
                "n": {"type": "integer", "minimum": 10, "maximum": 12},
                "even": {"type": "integer", "multipleOf": 2, "exclusiveMinimum": 5, "maximum": 8},
                "unit": {"$ref": "#/$defs/unit"},
                "when": {"type": "string", "format": "date-time"},
                "tags": {"type": "array", "items": {"type": "string", "maxLength": 3}, "minItems": 2},
            },
            "required": ["n", "unit"]
        });
        for seed in 0..50 {
            let v = gen(s.clone(), seed).unwrap();
            let n = v["n"].as_i64().unwrap();
            assert!((10..=12).contains(&n), "{v}");
            assert!([6, 8].contains(&v["even"].as_i64().unwrap()), "{v}");
            assert!(["celsius", "fahrenheit"].contains(&v["unit"].as_str().unwrap()));
            assert!(v["tags"].as_array().unwrap().len() >= 2);
            assert!(v["tags"][0].as_str().unwrap().len() <= 3);
        }
    }

    #[test]
    fn contradictions_and_unsupported_keywords_are_refused_with_their_path() {
        let cases = [
            (json!({"type":"integer","minimum":5,"maximum":4}), "#"),
            (
                json!({"properties":{"x":{"type":"string","pattern":"^a+$"}}}),
                "#/properties/x",
            ),
            (json!({"type":"array","minItems":3,"maxItems":2}), "#"),
            (json!({"properties":{"x":false}}), "#/properties/x"),
            (json!({"type":"tuple"}), "#"),
            (json!({"$ref":"#/$defs/missing"}), "#"),
        ];
        for (s, at) in cases {
            let e = gen(s.clone(), 1).unwrap_err();
            assert_eq!(e.at, at, "{s}: {e}");
        }
        let mut deep = json!({"type":"string"});
        for _ in 0..40 {
            deep = json!({"type":"array","items":deep,"minItems":1});
        }
        assert!(gen(deep, 1).unwrap_err().why.contains("deeper"));
    }

    #[test]
    fn schemas_that_ask_for_huge_answers_are_refused_not_generated() {
        // Each would hang an io thread or exhaust memory if generated.
        let mut wide = json!({"type":"string","minLength":1});
        for _ in 0..4 {
            wide = json!({"type":"array","items":wide,"minItems":64}); // 64^4 values
        }
        let cases = [
            (
                json!({"type":"object","minProperties":1_000_000_000_000u64}),
                "minProperties",
            ),
            (wide, "values"),
            (
                json!({"type":"array","minItems":64,
                       "items":{"type":"string","minLength":60_000}}),
                "bytes",
            ),
            (
                json!({"$defs":{"t":{"type":"array","minItems":2,"items":{"$ref":"#/$defs/t"}}},
                       "$ref":"#/$defs/t"}),
                "", // self-reference: refused by the value budget or the depth bound
            ),
        ];
        for (s, why) in cases {
            let e = gen(s.clone(), 1).unwrap_err();
            assert!(e.why.contains(why), "{s}: {e}");
        }
    }
}
