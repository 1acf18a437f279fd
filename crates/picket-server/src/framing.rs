//! The one framing of a snapshot, on disk (`snapshot.bin`) and on the wire (`InstallSnapshot`):
//! `[8-byte little-endian header length][header][body]`. The body (the state machine's bytes)
//! travels as it is, not re-encoded inside the header's JSON.

/// Why a framed snapshot cannot be split.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum FrameError {
    /// Shorter than the length prefix.
    #[error("too short")]
    TooShort,
    /// A header length this machine cannot address.
    #[error("bad header length")]
    BadLength,
    /// The header is cut short.
    #[error("truncated")]
    Truncated,
}

/// The length prefix of a frame whose header is `header`.
pub(crate) fn length_prefix(header: &[u8]) -> [u8; 8] {
    (header.len() as u64).to_le_bytes()
}

/// `header` and `body` as one frame.
pub(crate) fn frame(header: &[u8], body: &[u8]) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(8 + header.len() + body.len());
    bytes.extend_from_slice(&length_prefix(header));
    bytes.extend_from_slice(header);
    bytes.extend_from_slice(body);
    bytes
}

/// A frame's header and body.
pub(crate) fn unframe(bytes: &[u8]) -> Result<(&[u8], &[u8]), FrameError> {
    let (length, rest) = bytes.split_at_checked(8).ok_or(FrameError::TooShort)?;
    let length = u64::from_le_bytes(length.try_into().expect("split at 8 bytes"));
    let length = usize::try_from(length).map_err(|_| FrameError::BadLength)?;
    rest.split_at_checked(length).ok_or(FrameError::Truncated)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame_splits_back_into_its_header_and_body() {
        let framed = frame(b"{\"meta\":1}", b"state bytes");
        assert_eq!(unframe(&framed), Ok((&b"{\"meta\":1}"[..], &b"state bytes"[..])));
        assert_eq!(unframe(&framed[..5]), Err(FrameError::TooShort));
        assert_eq!(unframe(&framed[..12]), Err(FrameError::Truncated));
    }
}
