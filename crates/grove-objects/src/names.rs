//! The names a store accepts for streams, folders, objects and prefix
//! segments: one rule for every layout.

/// The longest stream name.
pub const STREAM_NAME_MAX_BYTES: usize = 200;

/// Why a stream or prefix-segment name is refused, if it is.
/// Names are ASCII letters, digits and `._-@:+=`, not starting with '.'.
pub(crate) fn check_name(name: &str) -> std::result::Result<(), String> {
    if name.is_empty() {
        return Err("empty name".into());
    }
    if name.len() > STREAM_NAME_MAX_BYTES {
        return Err(format!("longer than {STREAM_NAME_MAX_BYTES} bytes"));
    }
    if name.starts_with('.') {
        return Err("starts with '.'".into());
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || "._-@:+=".contains(*c)))
    {
        return Err(format!(
            "{c:?} is not allowed (letters, digits and ._-@:+= are)"
        ));
    }
    Ok(())
}
