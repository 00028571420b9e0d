//! Plain type conversions between Python objects and the Rust core's types.

use std::path::PathBuf;
use std::time::Duration;

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{
    PyBool, PyByteArray, PyBytes, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple,
};
use pyo3::IntoPyObjectExt;
use serde_json::{Map, Number, Value};

use crate::errors::invalid;

/// A JSON value as Python data (dict, list, str, int, float, bool, None).
pub fn json_to_py<'py>(py: Python<'py>, value: &Value) -> PyResult<Bound<'py, PyAny>> {
    match value {
        Value::Null => Ok(py.None().into_bound(py)),
        Value::Bool(b) => b.into_bound_py_any(py),
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                i.into_bound_py_any(py)
            } else if let Some(u) = n.as_u64() {
                u.into_bound_py_any(py)
            } else {
                n.as_f64().unwrap_or(f64::NAN).into_bound_py_any(py)
            }
        }
        Value::String(s) => s.into_bound_py_any(py),
        Value::Array(items) => {
            let list = PyList::empty(py);
            for item in items {
                list.append(json_to_py(py, item)?)?;
            }
            Ok(list.into_any())
        }
        Value::Object(map) => {
            let dict = PyDict::new(py);
            for (k, v) in map {
                dict.set_item(k, json_to_py(py, v)?)?;
            }
            Ok(dict.into_any())
        }
    }
}

/// Python data (mappings, sequences, str, bytes, numbers, bools, None, path-likes) as a
/// JSON value, for deserializing with the core's serde schema. `what` names the value in
/// errors.
pub fn py_to_json(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Value> {
    let py = obj.py();
    if obj.is_none() {
        Ok(Value::Null)
    } else if let Ok(b) = obj.cast::<PyBool>() {
        Ok(Value::Bool(b.is_true()))
    } else if obj.is_instance_of::<PyInt>() {
        if let Ok(i) = obj.extract::<i64>() {
            Ok(Value::from(i))
        } else if let Ok(u) = obj.extract::<u64>() {
            Ok(Value::from(u))
        } else {
            Err(invalid(
                py,
                format!("{what}: integer {obj} is out of range"),
            ))
        }
    } else if obj.is_instance_of::<PyFloat>() {
        let f: f64 = obj.extract()?;
        Number::from_f64(f)
            .map(Value::Number)
            .ok_or_else(|| invalid(py, format!("{what}: {f} is not a finite number")))
    } else if let Ok(s) = obj.cast::<PyString>() {
        Ok(Value::String(s.to_cow()?.into_owned()))
    } else if obj.is_instance_of::<PyBytes>() || obj.is_instance_of::<PyByteArray>() {
        let bytes: Vec<u8> = obj.extract()?;
        Ok(Value::Array(bytes.into_iter().map(Value::from).collect()))
    } else if let Ok(dict) = obj.cast::<PyDict>() {
        let mut map = Map::new();
        for (k, v) in dict.iter() {
            let key = k
                .cast::<PyString>()
                .map_err(|_| invalid(py, format!("{what}: keys must be strings, got {k:?}")))?
                .to_cow()?
                .into_owned();
            let value = py_to_json(&v, &format!("{what}.{key}"))?;
            map.insert(key, value);
        }
        Ok(Value::Object(map))
    } else if obj.is_instance_of::<PyList>() || obj.is_instance_of::<PyTuple>() {
        let mut items = Vec::new();
        for (i, item) in obj.try_iter()?.enumerate() {
            items.push(py_to_json(&item?, &format!("{what}[{i}]"))?);
        }
        Ok(Value::Array(items))
    } else if let Ok(path) = obj.extract::<PathBuf>() {
        Ok(Value::String(path.to_string_lossy().into_owned()))
    } else if let Ok(mapping) = obj.cast::<pyo3::types::PyMapping>() {
        py_to_json(&py.get_type::<PyDict>().call1((mapping,))?, what)
    } else {
        Err(invalid(
            py,
            format!(
                "{what}: unsupported value of type {}",
                obj.get_type().name()?
            ),
        ))
    }
}

/// Seconds (int or float) as a duration; negative, NaN and infinite values are refused.
pub fn seconds(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Duration> {
    let py = obj.py();
    if obj.is_instance_of::<PyBool>()
        || !(obj.is_instance_of::<PyInt>() || obj.is_instance_of::<PyFloat>())
    {
        return Err(invalid(
            py,
            format!(
                "{what} must be a number of seconds, got {}",
                obj.get_type().name()?
            ),
        ));
    }
    let value: f64 = obj.extract()?;
    Duration::try_from_secs_f64(value).map_err(|_| {
        invalid(
            py,
            format!("{what} must be a non-negative, finite number of seconds, got {value}"),
        )
    })
}

/// A str or path-like object as a path.
pub fn path(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<PathBuf> {
    if obj.is_instance_of::<PyBytes>() {
        return Err(invalid(
            obj.py(),
            format!("{what} must be a str or path, not bytes"),
        ));
    }
    obj.extract::<PathBuf>().map_err(|_| {
        let name = obj
            .get_type()
            .name()
            .map(|n| n.to_string())
            .unwrap_or_default();
        invalid(
            obj.py(),
            format!("{what} must be a str or os.PathLike, got {name}"),
        )
    })
}

/// An argv from a list or tuple of str (a bare str is refused: tools are never shell
/// strings).
pub fn argv(obj: &Bound<'_, PyAny>) -> PyResult<Vec<String>> {
    if obj.is_instance_of::<PyString>() || obj.is_instance_of::<PyBytes>() {
        return Err(PyTypeError::new_err(
            "a tool is an argv list such as [\"python3\", \"-c\", code] or a strata.Tool, never a \
             shell string (use strata.Tool.script(\"sh\", source) to run shell code)",
        ));
    }
    let mut out = Vec::new();
    let iter = obj.try_iter().map_err(|_| {
        PyTypeError::new_err(format!(
            "tool must be an argv list or a strata.Tool, got {}",
            obj.get_type()
                .name()
                .map(|n| n.to_string())
                .unwrap_or_default()
        ))
    })?;
    for item in iter {
        let item = item?;
        match item.cast::<PyString>() {
            Ok(s) => out.push(s.to_cow()?.into_owned()),
            Err(_) => match item.extract::<PathBuf>() {
                Ok(p) if !item.is_instance_of::<PyBytes>() => {
                    out.push(p.to_string_lossy().into_owned())
                }
                _ => {
                    return Err(PyTypeError::new_err(format!(
                        "argv items must be str or os.PathLike, got {}",
                        item.get_type().name()?
                    )))
                }
            },
        }
    }
    Ok(out)
}
