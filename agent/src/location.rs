//! Where the agent fetches something from, as settings and the managed service write it:
//! `ssm:<parameter>`, `secretsmanager:<secret>`, `file:<absolute path>` and
//! `s3://<bucket>/<key>`.
//!
//! [`Location::parse`] is the one reader of that syntax. It only tells the kind of
//! location and what follows the scheme; each user checks what it accepts there and says
//! what is wrong in its own words: the cluster key's source (`auth.key_source`,
//! `authkey::KeySource`: SSM, Secrets Manager or a file, with an optional `#field`) and
//! the lifecycle scripts' `scriptLocation` (`node_lifecycle`: S3, SSM or a file, with S3's
//! and Parameter Store's naming rules).
//!
//! Floor 0 (ground): uses no other module of the crate.

/// A location, by its scheme.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Location<'a> {
    /// `ssm:<parameter name or ARN>`: what follows `ssm:`.
    Ssm(&'a str),
    /// `secretsmanager:<secret id or ARN>`: what follows `secretsmanager:`.
    SecretsManager(&'a str),
    /// `file:<path>`: what follows `file:` (absolute or not: the user checks).
    File(&'a str),
    /// `s3://<bucket>/<key>`: what follows `s3://` ([`Location::s3_object`] splits it).
    S3(&'a str),
}

impl<'a> Location<'a> {
    /// The location `s` names, by its scheme (case-sensitive, as written); `None` for text
    /// with none of the four.
    pub fn parse(s: &'a str) -> Option<Location<'a>> {
        if let Some(rest) = s.strip_prefix("s3://") {
            return Some(Location::S3(rest));
        }
        match s.split_once(':')? {
            ("ssm", rest) => Some(Location::Ssm(rest)),
            ("secretsmanager", rest) => Some(Location::SecretsManager(rest)),
            ("file", rest) => Some(Location::File(rest)),
            _ => None,
        }
    }

    /// An S3 location's bucket and key (neither empty; the key is everything after the
    /// first `/`, as written: S3 URIs are not percent-encoded); `None` for any other
    /// location.
    pub fn s3_object(&self) -> Option<(&'a str, &'a str)> {
        match self {
            Location::S3(rest) => rest
                .split_once('/')
                .filter(|(b, k)| !b.is_empty() && !k.is_empty()),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scheme_decides_and_the_rest_is_as_written() {
        assert_eq!(Location::parse("ssm:/a/b#f"), Some(Location::Ssm("/a/b#f")));
        assert_eq!(
            Location::parse("secretsmanager:arn:aws:secretsmanager:r:1:secret:x"),
            Some(Location::SecretsManager(
                "arn:aws:secretsmanager:r:1:secret:x"
            ))
        );
        assert_eq!(
            Location::parse("file:relative"),
            Some(Location::File("relative"))
        );
        assert_eq!(Location::parse("ssm:"), Some(Location::Ssm("")));
        assert_eq!(
            Location::parse("s3://b/k/x").and_then(|l| l.s3_object()),
            Some(("b", "k/x"))
        );
        assert_eq!(Location::parse("s3://b").and_then(|l| l.s3_object()), None);
        assert_eq!(Location::parse("ssm:/x").and_then(|l| l.s3_object()), None);
        for none in [
            "",
            "/etc/x",
            "SSM:/x",
            "S3://b/k",
            "s3:/b/k",
            "https://x/y",
            "ssm",
        ] {
            assert_eq!(Location::parse(none), None, "{none}");
        }
    }
}
