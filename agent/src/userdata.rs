//! The settings part of MIME multipart user data.
//!
//! cloud-init (and the managed Slurm service, which requires multipart user data) accept a
//! MIME multipart document (RFC 2046, as cloud-init's "MIME multi-part archive" describes);
//! each part has its own content type. The agent reads only the part whose content type is
//! [`crate::settings::USER_DATA_CONTENT_TYPE`], a TOML document with the same keys as the
//! settings files. Every other part (shell scripts, cloud-config) is ignored, and so is user
//! data that is not multipart.

use crate::settings::USER_DATA_CONTENT_TYPE;

/// Error reading user data that claims to be multipart.
#[derive(Debug, thiserror::Error)]
#[error("user data: malformed MIME multipart document: {0}")]
pub struct UserDataError(String);

/// Returns the text of the settings part, if the user data is multipart and has one.
/// Several such parts are concatenated in order.
///
/// # Errors
/// [`UserDataError`] when the document says it is multipart but cannot be parsed.
pub fn settings_part(user_data: &[u8]) -> Result<Option<String>, UserDataError> {
    let head = String::from_utf8_lossy(&user_data[..user_data.len().min(4096)]).to_lowercase();
    if !head.contains("content-type:") || !head.contains("multipart/") {
        return Ok(None);
    }
    let mail = mailparse::parse_mail(user_data).map_err(|e| UserDataError(e.to_string()))?;
    if !mail.ctype.mimetype.starts_with("multipart/") {
        return Ok(None);
    }
    let mut found: Option<String> = None;
    let mut stack = vec![&mail];
    while let Some(part) = stack.pop() {
        if part
            .ctype
            .mimetype
            .eq_ignore_ascii_case(USER_DATA_CONTENT_TYPE)
        {
            let body = part.get_body().map_err(|e| UserDataError(e.to_string()))?;
            let text = found.get_or_insert_with(String::new);
            text.push_str(&body);
            text.push('\n');
        }
        // Depth-first, keeping document order.
        stack.extend(part.subparts.iter().rev());
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    const DOC: &str = "Content-Type: multipart/mixed; boundary=\"==B==\"\r\nMIME-Version: 1.0\r\n\r\n--==B==\r\nContent-Type: text/x-shellscript; charset=\"us-ascii\"\r\n\r\n#!/bin/bash\necho hi\n\r\n--==B==\r\nContent-Type: application/x-slurm-node-agent\r\n\r\n[node]\nname = \"gpu-7\"\n\r\n--==B==--\r\n";

    #[test]
    fn finds_the_settings_part_and_ignores_others() {
        let part = settings_part(DOC.as_bytes()).unwrap().unwrap();
        assert!(part.contains("name = \"gpu-7\""), "{part}");
        assert!(!part.contains("echo hi"));
    }

    #[test]
    fn plain_scripts_have_no_settings() {
        assert_eq!(settings_part(b"#!/bin/bash\necho hi\n").unwrap(), None);
        assert_eq!(settings_part(b"").unwrap(), None);
    }

    #[test]
    fn multipart_without_our_part_has_none() {
        let doc = DOC.replace("application/x-slurm-node-agent", "text/cloud-config");
        assert_eq!(settings_part(doc.as_bytes()).unwrap(), None);
    }
}
