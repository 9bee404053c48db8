//! An error and its sources on one line, for the messages a client or a service shows: tonic's
//! own text ("transport error") hides the cause ("Connection refused") in its source, and so do
//! hyper's and rustls's. Here because every crate that talks over this contract shows such
//! errors (central, the site-forwarder and `outboxctl`) and already depends on this crate, while
//! none of them may depend on another.

/// `error`'s text followed by each source's, skipping a source whose text is already included
/// (many errors repeat their source's text in their own): "transport error: tcp connect error:
/// Connection refused (os error 111)".
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An error with a text and an optional source.
    #[derive(Debug)]
    struct Layer(&'static str, Option<Box<Layer>>);

    impl std::fmt::Display for Layer {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.0)
        }
    }

    impl std::error::Error for Layer {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            self.1.as_deref().map(|s| s as _)
        }
    }

    #[test]
    fn every_source_is_named_in_order() {
        let error = Layer(
            "transport error",
            Some(Box::new(Layer(
                "tcp connect error",
                Some(Box::new(Layer("Connection refused (os error 111)", None))),
            ))),
        );
        assert_eq!(
            error_chain(&error),
            "transport error: tcp connect error: Connection refused (os error 111)"
        );
    }

    #[test]
    fn a_source_already_in_the_text_is_not_repeated() {
        let error = Layer(
            "cannot connect: Connection refused",
            Some(Box::new(Layer("Connection refused", None))),
        );
        assert_eq!(error_chain(&error), "cannot connect: Connection refused");
        assert_eq!(error_chain(&Layer("alone", None)), "alone");
    }
}
