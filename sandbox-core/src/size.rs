//! Byte sizes that read like people write them (`"256M"`, `"1.5G"`, `4096`).

use std::fmt;
use std::str::FromStr;

use std::borrow::Cow;

use schemars::{json_schema, JsonSchema, Schema, SchemaGenerator};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A number of bytes.
///
/// Parses from an integer or a string with an optional binary suffix: `K`, `M`, `G`, `T`
/// (also `KiB`, `MB`, ...; all mean powers of 1024). Serializes as a plain integer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct ByteSize(pub u64);

impl ByteSize {
    /// `n` kibibytes.
    pub const fn kib(n: u64) -> Self {
        ByteSize(n * 1024)
    }
    /// `n` mebibytes.
    pub const fn mib(n: u64) -> Self {
        ByteSize(n * 1024 * 1024)
    }
    /// `n` gibibytes.
    pub const fn gib(n: u64) -> Self {
        ByteSize(n * 1024 * 1024 * 1024)
    }
    /// The number of bytes.
    pub const fn bytes(self) -> u64 {
        self.0
    }
}

/// Why a size string did not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid size {input:?}: {reason} (expected e.g. 4096, \"512K\", \"256M\", \"1G\")")]
pub struct ParseSizeError {
    input: String,
    reason: &'static str,
}

impl FromStr for ByteSize {
    type Err = ParseSizeError;

    fn from_str(input: &str) -> Result<Self, Self::Err> {
        let err = |reason| ParseSizeError {
            input: input.to_string(),
            reason,
        };
        let s = input.trim();
        let split = s
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(s.len());
        let (number, suffix) = s.split_at(split);
        if number.is_empty() {
            return Err(err("no number"));
        }
        let multiplier: u64 = match suffix.trim().to_ascii_lowercase().as_str() {
            "" | "b" => 1,
            "k" | "kb" | "kib" => 1 << 10,
            "m" | "mb" | "mib" => 1 << 20,
            "g" | "gb" | "gib" => 1 << 30,
            "t" | "tb" | "tib" => 1 << 40,
            _ => return Err(err("unknown unit")),
        };
        if let Ok(whole) = number.parse::<u64>() {
            return whole
                .checked_mul(multiplier)
                .map(ByteSize)
                .ok_or_else(|| err("too large"));
        }
        let value: f64 = number.parse().map_err(|_| err("not a number"))?;
        let bytes = value * multiplier as f64;
        if !bytes.is_finite() || bytes >= u64::MAX as f64 {
            return Err(err("too large"));
        }
        Ok(ByteSize(bytes.round() as u64))
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [(&str, u64); 4] = [
            ("T", 1 << 40),
            ("G", 1 << 30),
            ("M", 1 << 20),
            ("K", 1 << 10),
        ];
        for (unit, size) in UNITS {
            if self.0 >= size && self.0.is_multiple_of(size) {
                return write!(f, "{}{unit}", self.0 / size);
            }
        }
        write!(f, "{}B", self.0)
    }
}

impl Serialize for ByteSize {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_u64(self.0)
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = ByteSize;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a byte count or a size string such as \"256M\"")
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<ByteSize, E> {
                Ok(ByteSize(v))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<ByteSize, E> {
                u64::try_from(v)
                    .map(ByteSize)
                    .map_err(|_| E::custom(format!("size must not be negative, got {v}")))
            }
            fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<ByteSize, E> {
                if v.is_finite() && v >= 0.0 && v.fract() == 0.0 && v < u64::MAX as f64 {
                    Ok(ByteSize(v as u64))
                } else {
                    Err(E::custom(format!(
                        "size must be a whole non-negative number, got {v}"
                    )))
                }
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<ByteSize, E> {
                v.parse().map_err(E::custom)
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}

/// The size-string form [`ByteSize`]'s `FromStr` accepts, as an ECMA-262 regular expression
/// (JSON Schema's `pattern`): a number, optionally with a fraction, then an optional unit.
pub const SIZE_PATTERN: &str =
    r"^\s*([0-9]+\.?[0-9]*|\.[0-9]+)\s*([bB]|[kKmMgGtT]([iI]?[bB])?)?\s*$";

/// Read as an integer or a size string (`"256M"`); written as an integer.
impl JsonSchema for ByteSize {
    fn schema_name() -> Cow<'static, str> {
        "ByteSize".into()
    }

    fn schema_id() -> Cow<'static, str> {
        "sandbox_core::size::ByteSize".into()
    }

    fn json_schema(generator: &mut SchemaGenerator) -> Schema {
        if generator.contract().is_serialize() {
            return json_schema!({
                "description": "A number of bytes.",
                "type": "integer",
                "minimum": 0,
            });
        }
        json_schema!({
            "description": "A number of bytes: an integer, or a string with an optional binary unit (K, M, G, T, also KiB, MB, ...; all powers of 1024), such as \"512K\", \"256M\" or \"1.5G\".",
            "anyOf": [
                { "type": "integer", "minimum": 0 },
                { "type": "string", "pattern": SIZE_PATTERN },
            ],
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_suffixes_as_powers_of_1024() {
        let cases = [
            ("4096", 4096),
            ("512K", 512 << 10),
            ("256M", 256 << 20),
            ("256MiB", 256 << 20),
            ("1g", 1 << 30),
            ("1.5G", 3 << 29),
            (" 2 M ", 2 << 20),
        ];
        for (input, bytes) in cases {
            assert_eq!(input.parse::<ByteSize>(), Ok(ByteSize(bytes)), "{input}");
        }
    }

    #[test]
    fn rejects_garbage_with_a_reason() {
        for input in ["", "M", "12X", "-1", "1e99T", "1.2.3M"] {
            let err = input.parse::<ByteSize>().expect_err(input);
            assert!(err.to_string().contains("invalid size"), "{err}");
        }
    }

    #[test]
    fn displays_the_largest_exact_unit() {
        assert_eq!(ByteSize::mib(256).to_string(), "256M");
        assert_eq!(ByteSize(1000).to_string(), "1000B");
        assert_eq!(ByteSize::gib(2).to_string(), "2G");
    }
}
