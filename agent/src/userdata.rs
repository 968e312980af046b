//! The settings parts of MIME multipart user data.
//!
//! cloud-init (and the managed Slurm service, which requires multipart user data) accept a
//! MIME multipart document (RFC 2046, as cloud-init's "MIME multi-part archive" describes);
//! each part has its own content type. The agent reads only the parts whose content type is
//! [`USER_DATA_CONTENT_TYPE`], TOML documents with the same keys as the
//! settings files, each its own settings layer (later parts override earlier ones). Every
//! other part (shell scripts, cloud-config) is ignored, and so is user data that is not
//! multipart.
//!
//! Compression, as cloud-init accepts it (EC2's 16 KiB user-data limit pushes people to
//! it): the whole document may be gzip-compressed (RFC 1952, recognized by its magic bytes
//! `1f 8b`), and a part may carry `Content-Encoding: gzip`, with or without
//! `Content-Transfer-Encoding: base64`. Sizes are capped: [`MAX_USER_DATA`] bytes as read,
//! [`MAX_DECOMPRESSED`] bytes after decompression.
//!
//! Errors name the part (its 1-based position among the document's leaf parts) and never
//! carry the part's bytes.
//!
//! Floor 0 (ground): uses no other module of the crate.

use std::io::Read;

/// MIME content type of the user-data part that carries settings (TOML text).
pub const USER_DATA_CONTENT_TYPE: &str = "application/x-slurm-node-agent";

/// Largest user data read, in bytes (EC2 allows 16 KiB; this leaves room for other
/// launchers and local use).
pub const MAX_USER_DATA: usize = 256 * 1024;
/// Largest user data, or agent part, after gzip decompression, in bytes.
pub const MAX_DECOMPRESSED: usize = 1024 * 1024;

/// Error reading user data.
#[derive(Debug, thiserror::Error)]
pub enum UserDataError {
    /// The document says it is multipart but cannot be parsed.
    #[error("user data: malformed MIME multipart document")]
    Malformed,
    /// Too large, as read or after decompression.
    #[error("user data{}: larger than {limit} bytes{}", part_label(*part), if *decompressed { " after gzip decompression" } else { "" })]
    TooLarge {
        /// Part number (0: the whole document).
        part: usize,
        /// The cap that was passed.
        limit: usize,
        /// Whether the cap is the one after decompression.
        decompressed: bool,
    },
    /// A part (or the whole document, part 0) cannot be decoded.
    #[error("user data{}: {message}", part_label(*part))]
    Part {
        /// Part number (0: the whole document).
        part: usize,
        /// What is wrong (never the part's bytes).
        message: &'static str,
    },
}

impl UserDataError {
    /// The part concerned (0: the whole document).
    pub fn part(&self) -> usize {
        match self {
            UserDataError::Malformed => 0,
            UserDataError::TooLarge { part, .. } | UserDataError::Part { part, .. } => *part,
        }
    }

    /// What is wrong, without the part's name.
    pub fn detail(&self) -> String {
        let text = self.to_string();
        let label = format!("user data{}: ", part_label(self.part()));
        text.strip_prefix(&label).unwrap_or(&text).to_string()
    }
}

fn part_label(part: usize) -> String {
    if part == 0 {
        String::new()
    } else {
        format!(" part {part} ({USER_DATA_CONTENT_TYPE})")
    }
}

/// One settings part: its 1-based position among the document's leaf parts, and its text.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SettingsPart {
    /// Position among the leaf parts, in document order, from 1.
    pub index: usize,
    /// The TOML text.
    pub text: String,
}

/// Whether `data` starts with gzip's magic bytes.
fn is_gzip(data: &[u8]) -> bool {
    data.starts_with(&[0x1f, 0x8b])
}

/// Decompresses gzip (several members, as `gzip` concatenations make) up to
/// [`MAX_DECOMPRESSED`] bytes.
fn gunzip(data: &[u8], part: usize) -> Result<Vec<u8>, UserDataError> {
    let mut out = Vec::new();
    let limit = u64::try_from(MAX_DECOMPRESSED).unwrap_or(u64::MAX) + 1;
    flate2::read::MultiGzDecoder::new(data)
        .take(limit)
        .read_to_end(&mut out)
        .map_err(|_| UserDataError::Part {
            part,
            message: "not valid gzip data",
        })?;
    if out.len() > MAX_DECOMPRESSED {
        return Err(UserDataError::TooLarge {
            part,
            limit: MAX_DECOMPRESSED,
            decompressed: true,
        });
    }
    Ok(out)
}

/// The value of the top-level `Content-Type` header, lowercased, if the document starts
/// with MIME headers.
fn top_content_type(doc: &[u8]) -> Option<String> {
    let head = &doc[..doc.len().min(8192)];
    let text = String::from_utf8_lossy(head);
    let mut value: Option<String> = None;
    for line in text.lines() {
        if line.trim().is_empty() {
            break;
        }
        if let Some(v) = value.as_mut() {
            if line.starts_with([' ', '\t']) {
                v.push(' ');
                v.push_str(line.trim());
                continue;
            }
            break;
        }
        if let Some((k, v)) = line.split_once(':') {
            if k.trim().eq_ignore_ascii_case("content-type") {
                value = Some(v.trim().to_string());
            }
        }
    }
    value.map(|v| v.to_lowercase())
}

/// Returns the settings parts, in document order.
///
/// # Errors
/// [`UserDataError`]: too large, not valid gzip, a multipart document that cannot be
/// parsed, or an agent part that cannot be decoded (transfer encoding, gzip, UTF-8).
pub fn settings_parts(user_data: &[u8]) -> Result<Vec<SettingsPart>, UserDataError> {
    if user_data.len() > MAX_USER_DATA {
        return Err(UserDataError::TooLarge {
            part: 0,
            limit: MAX_USER_DATA,
            decompressed: false,
        });
    }
    let unzipped;
    let doc = if is_gzip(user_data) {
        unzipped = gunzip(user_data, 0)?;
        &unzipped[..]
    } else {
        user_data
    };
    let Some(ctype) = top_content_type(doc) else {
        return Ok(Vec::new());
    };
    if !ctype.starts_with("multipart/") {
        return Ok(Vec::new());
    }
    if !ctype.contains("boundary=") {
        tracing::warn!(
            "user data says {ctype:?} but has no boundary= parameter: it is not read as \
             multipart, so no settings come from it"
        );
        return Ok(Vec::new());
    }
    let mail = mailparse::parse_mail(doc).map_err(|_| UserDataError::Malformed)?;
    let mut found = Vec::new();
    let mut index = 0;
    let mut stack = vec![&mail];
    while let Some(part) = stack.pop() {
        if part.subparts.is_empty() {
            index += 1;
            if part
                .ctype
                .mimetype
                .eq_ignore_ascii_case(USER_DATA_CONTENT_TYPE)
            {
                found.push(SettingsPart {
                    index,
                    text: part_text(part, index)?,
                });
            }
        }
        // Depth-first, keeping document order.
        stack.extend(part.subparts.iter().rev());
    }
    Ok(found)
}

/// The decoded text of one agent part: transfer encoding, then `Content-Encoding: gzip`
/// (or gzip's magic bytes), then UTF-8.
fn part_text(part: &mailparse::ParsedMail<'_>, index: usize) -> Result<String, UserDataError> {
    use mailparse::MailHeaderMap;
    let raw = part.get_body_raw().map_err(|_| UserDataError::Part {
        part: index,
        message: "its Content-Transfer-Encoding cannot be decoded",
    })?;
    let gzip_header = part
        .headers
        .get_first_value("Content-Encoding")
        .is_some_and(|v| {
            let v = v.trim().to_ascii_lowercase();
            v == "gzip" || v == "x-gzip"
        });
    let bytes = if gzip_header || is_gzip(&raw) {
        gunzip(&raw, index)?
    } else {
        raw
    };
    String::from_utf8(bytes).map_err(|_| UserDataError::Part {
        part: index,
        message: "not UTF-8 text (TOML expected)",
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use base64::Engine;
    use std::io::Write;

    const DOC: &str = "Content-Type: multipart/mixed; boundary=\"==B==\"\r\nMIME-Version: 1.0\r\n\r\n--==B==\r\nContent-Type: text/x-shellscript; charset=\"us-ascii\"\r\n\r\n#!/bin/bash\necho hi\n\r\n--==B==\r\nContent-Type: application/x-slurm-node-agent\r\n\r\n[node]\nname = \"gpu-7\"\n\r\n--==B==--\r\n";

    fn gz(data: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        e.write_all(data).unwrap();
        e.finish().unwrap()
    }

    fn texts(parts: &[SettingsPart]) -> Vec<(usize, &str)> {
        parts.iter().map(|p| (p.index, p.text.trim())).collect()
    }

    #[test]
    fn finds_the_settings_part_and_ignores_others() {
        let parts = settings_parts(DOC.as_bytes()).unwrap();
        assert_eq!(texts(&parts), [(2, "[node]\nname = \"gpu-7\"")]);
    }

    #[test]
    fn plain_scripts_have_no_settings() {
        assert!(settings_parts(b"#!/bin/bash\necho hi\n")
            .unwrap()
            .is_empty());
        assert!(settings_parts(b"").unwrap().is_empty());
    }

    #[test]
    fn multipart_without_our_part_has_none() {
        let doc = DOC.replace("application/x-slurm-node-agent", "text/cloud-config");
        assert!(settings_parts(doc.as_bytes()).unwrap().is_empty());
    }

    #[test]
    fn each_agent_part_is_separate_in_order() {
        let doc = DOC.replace(
            "--==B==--",
            "--==B==\r\nContent-Type: application/x-slurm-node-agent\r\n\r\n[node]\nweight = 3\n\r\n--==B==--",
        );
        let parts = settings_parts(doc.as_bytes()).unwrap();
        assert_eq!(
            texts(&parts),
            [(2, "[node]\nname = \"gpu-7\""), (3, "[node]\nweight = 3")]
        );
    }

    #[test]
    fn a_gzip_compressed_document_is_read() {
        let parts = settings_parts(&gz(DOC.as_bytes())).unwrap();
        assert_eq!(texts(&parts), [(2, "[node]\nname = \"gpu-7\"")]);
    }

    #[test]
    fn a_gzip_part_is_read_with_or_without_base64() {
        let toml = b"[node]\nname = \"zipped\"\n";
        let b64 = base64::engine::general_purpose::STANDARD.encode(gz(toml));
        let doc = format!(
            "Content-Type: multipart/mixed; boundary=\"B\"\r\n\r\n--B\r\n\
             Content-Type: application/x-slurm-node-agent\r\n\
             Content-Encoding: gzip\r\nContent-Transfer-Encoding: base64\r\n\r\n{b64}\r\n--B--\r\n"
        );
        let parts = settings_parts(doc.as_bytes()).unwrap();
        assert_eq!(texts(&parts), [(1, "[node]\nname = \"zipped\"")]);
        // Binary, no transfer encoding.
        let mut doc = b"Content-Type: multipart/mixed; boundary=\"B\"\r\n\r\n--B\r\n\
             Content-Type: application/x-slurm-node-agent\r\nContent-Encoding: gzip\r\n\r\n"
            .to_vec();
        doc.extend(gz(toml));
        doc.extend(b"\r\n--B--\r\n");
        let parts = settings_parts(&doc).unwrap();
        assert_eq!(texts(&parts), [(1, "[node]\nname = \"zipped\"")]);
    }

    #[test]
    fn an_undecodable_part_is_named_without_its_bytes() {
        let doc = "Content-Type: multipart/mixed; boundary=\"B\"\r\n\r\n--B\r\n\
             Content-Type: text/x-shellscript\r\n\r\necho\r\n--B\r\n\
             Content-Type: application/x-slurm-node-agent\r\n\
             Content-Encoding: gzip\r\n\r\nSECRETSTUFF-not-gzip\r\n--B--\r\n";
        let e = settings_parts(doc.as_bytes()).unwrap_err();
        assert_eq!(
            e.to_string(),
            "user data part 2 (application/x-slurm-node-agent): not valid gzip data"
        );
        assert_eq!((e.part(), e.detail().as_str()), (2, "not valid gzip data"));
        let doc = doc
            .replace("Content-Encoding: gzip\r\n", "")
            .replace("SECRETSTUFF-not-gzip", "\u{0}\u{ff}");
        let bytes: Vec<u8> = doc.bytes().map(|b| if b == 0 { 0xff } else { b }).collect();
        let e = settings_parts(&bytes).unwrap_err();
        assert!(
            e.to_string().ends_with(
                "part 2 (application/x-slurm-node-agent): not UTF-8 text (TOML expected)"
            ),
            "{e}"
        );
        let e = settings_parts(&[0x1f, 0x8b, 1, 2, 3]).unwrap_err();
        assert_eq!(e.to_string(), "user data: not valid gzip data");
    }

    #[test]
    fn sizes_are_capped() {
        let big = vec![b'#'; MAX_USER_DATA + 1];
        assert!(matches!(
            settings_parts(&big).unwrap_err(),
            UserDataError::TooLarge {
                decompressed: false,
                ..
            }
        ));
        let bomb = gz(&vec![b' '; MAX_DECOMPRESSED + 10]);
        assert!(bomb.len() < MAX_USER_DATA);
        let e = settings_parts(&bomb).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!("user data: larger than {MAX_DECOMPRESSED} bytes after gzip decompression")
        );
    }

    #[test]
    fn multipart_without_a_boundary_is_ignored() {
        let doc = "Content-Type: multipart/mixed\r\n\r\n--B\r\nContent-Type: application/x-slurm-node-agent\r\n\r\n[node]\r\n--B--\r\n";
        assert!(settings_parts(doc.as_bytes()).unwrap().is_empty());
    }

    proptest::proptest! {
        // Cases: proptest's default (256), or PROPTEST_CASES (CI's longer run).

        /// Arbitrary bytes, and arbitrary bytes after multipart headers, never panic and
        /// never put input bytes in an error.
        #[test]
        fn fuzz_never_panics(body in proptest::collection::vec(proptest::num::u8::ANY, 0..2048), gzip in proptest::bool::ANY) {
            let mut doc = b"Content-Type: multipart/mixed; boundary=\"B\"\r\n\r\n--B\r\nContent-Type: application/x-slurm-node-agent\r\n".to_vec();
            doc.extend(&body);
            doc.extend(b"\r\n--B--\r\n");
            for input in [body.clone(), doc] {
                let input = if gzip { gz(&input) } else { input };
                if let Err(e) = settings_parts(&input) {
                    let text = e.to_string();
                    proptest::prop_assert!(text.starts_with("user data"), "{}", text);
                    proptest::prop_assert!(text.len() < 200, "{}", text);
                }
            }
        }
    }
}
