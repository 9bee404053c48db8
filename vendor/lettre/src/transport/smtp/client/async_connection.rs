use std::{fmt::Display, net::IpAddr, time::Duration};

use futures_util::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

#[cfg(feature = "tokio1")]
use super::async_net::AsyncTokioStream;
#[cfg(feature = "tracing")]
use super::escape_crlf;
#[allow(deprecated)]
use super::{
    ClientCodec, MAX_RESPONSE_BYTES, MAX_RESPONSE_LINE_BYTES, TlsParameters,
    async_net::AsyncNetworkStream,
};
use crate::{
    Envelope,
    transport::smtp::{
        authentication::{Credentials, Mechanism},
        commands::{Auth, Data, Ehlo, Mail, Noop, Quit, Rcpt, Starttls},
        error,
        error::Error,
        extension::{ClientId, Extension, MailBodyParameter, MailParameter, ServerInfo},
        response::{Response, parse_response},
    },
};

macro_rules! try_smtp (
    ($err: expr, $client: ident) => ({
        match $err {
            Ok(val) => val,
            Err(err) => {
                $client.abort().await;
                return Err(From::from(err))
            },
        }
    })
);

/// Structure that implements the SMTP client
pub struct AsyncSmtpConnection {
    /// TCP stream between client and server
    /// Value is None before connection
    #[allow(deprecated)]
    stream: BufReader<AsyncNetworkStream>,
    /// Panic state
    panic: bool,
    /// Information about the server
    server_info: ServerInfo,
}

impl AsyncSmtpConnection {
    /// Get information about the server
    pub fn server_info(&self) -> &ServerInfo {
        &self.server_info
    }

    /// Connects with existing async stream
    ///
    /// Sends EHLO and parses server information
    #[cfg(feature = "tokio1")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tokio1")))]
    pub async fn connect_with_transport(
        stream: Box<dyn AsyncTokioStream>,
        hello_name: &ClientId,
    ) -> Result<AsyncSmtpConnection, Error> {
        #[allow(deprecated)]
        let stream = AsyncNetworkStream::use_existing_tokio1(stream);
        Self::connect_impl(stream, hello_name).await
    }

    /// Connects to the configured server
    ///
    /// If `tls_parameters` is `Some`, then the connection will use Implicit TLS (sometimes
    /// referred to as `SMTPS`). See also [`AsyncSmtpConnection::starttls`].
    ///
    /// If `local_address` is `Some`, then the address provided shall be used to bind the
    /// connection to a specific local address using [`tokio1_crate::net::TcpSocket::bind`].
    ///
    /// Sends EHLO and parses server information
    ///
    /// # Example
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # use lettre::transport::smtp::{client::{AsyncSmtpConnection, TlsParameters}, extension::ClientId};
    /// # use tokio1_crate::{self as tokio, net::ToSocketAddrs as _};
    /// #
    /// # #[tokio::main]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let connection = AsyncSmtpConnection::connect_tokio1(
    ///     ("example.com", 465),
    ///     Some(Duration::from_secs(60)),
    ///     &ClientId::default(),
    ///     Some(TlsParameters::new("example.com".to_owned())?),
    ///     None,
    /// )
    /// .await?;
    /// # Ok(())
    /// # }
    /// ```
    #[cfg(feature = "tokio1")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tokio1")))]
    pub async fn connect_tokio1<T: tokio1_crate::net::ToSocketAddrs>(
        server: T,
        timeout: Option<Duration>,
        hello_name: &ClientId,
        tls_parameters: Option<TlsParameters>,
        local_address: Option<IpAddr>,
    ) -> Result<AsyncSmtpConnection, Error> {
        #[allow(deprecated)]
        let stream =
            AsyncNetworkStream::connect_tokio1(server, timeout, tls_parameters, local_address)
                .await?;
        Self::connect_impl(stream, hello_name).await
    }

    /// Connects to the configured server
    ///
    /// Sends EHLO and parses server information
    #[cfg(feature = "async-std1")]
    #[cfg_attr(docsrs, doc(cfg(feature = "async-std1")))]
    pub async fn connect_asyncstd1<T: async_std::net::ToSocketAddrs>(
        server: T,
        timeout: Option<Duration>,
        hello_name: &ClientId,
        tls_parameters: Option<TlsParameters>,
    ) -> Result<AsyncSmtpConnection, Error> {
        #[allow(deprecated)]
        let stream = AsyncNetworkStream::connect_asyncstd1(server, timeout, tls_parameters).await?;
        Self::connect_impl(stream, hello_name).await
    }

    #[allow(deprecated)]
    async fn connect_impl(
        stream: AsyncNetworkStream,
        hello_name: &ClientId,
    ) -> Result<AsyncSmtpConnection, Error> {
        let stream = BufReader::new(stream);
        let mut conn = AsyncSmtpConnection {
            stream,
            panic: false,
            server_info: ServerInfo::default(),
        };
        // TODO log
        let _response = conn.read_response().await?;

        conn.ehlo(hello_name).await?;

        // Print server information
        #[cfg(feature = "tracing")]
        tracing::debug!("server {}", conn.server_info);
        Ok(conn)
    }

    pub async fn send(&mut self, envelope: &Envelope, email: &[u8]) -> Result<Response, Error> {
        // PATCH: the envelope is its own public step (`send_envelope`, pipelined when the server
        // allows it), so a caller can tell a failure before any message content was written
        // (nothing can have been accepted) from one after.
        self.send_envelope(envelope, email).await?;

        // Message content
        let result = try_smtp!(self.message(email).await, self);
        Ok(result)
    }

    /// PATCH: MAIL FROM, one RCPT TO per recipient and DATA, up to the server's `354`; send
    /// the message with [`Self::message`] next. `email` is only looked at to choose the MAIL
    /// parameters (8BITMIME, SMTPUTF8).
    ///
    /// When the server advertises PIPELINING (RFC 2920) the commands go in one write and the
    /// replies are read in order afterwards, so the envelope costs one round trip. The outcome
    /// is the one sending them one at a time would have had: the first negative reply among
    /// MAIL and the RCPTs is the error (a refused DATA is the error only when everything before
    /// it was accepted, since a server answers DATA with 503/554 when no recipient was), and
    /// the transaction does not go on. If the server accepted DATA despite an earlier refusal,
    /// the connection is closed without ending the data: a transaction cut off before its end
    /// of data is never delivered (RFC 5321 §3.8), so no recipient gets a message whose
    /// envelope was refused in part, as with the commands sent one at a time.
    ///
    /// After the server refused something, or the connection failed, the connection is closed
    /// ([`Self::has_broken`]); the client-side refusals (SMTPUTF8, 8BITMIME) come before
    /// anything is sent and leave it as it was.
    pub async fn send_envelope(
        &mut self,
        envelope: &Envelope,
        email: &[u8],
    ) -> Result<Response, Error> {
        let mail = self.mail_command(envelope, email)?;
        if self.server_info.supports_feature(Extension::Pipelining) {
            let group = envelope_group(mail, envelope);
            try_smtp!(self.write(group.as_bytes()).await, self);
            return self.envelope_replies(envelope.to().len()).await;
        }

        try_smtp!(self.command(mail).await, self);

        // Recipient
        for to_address in envelope.to() {
            try_smtp!(
                self.command(Rcpt::new(to_address.clone(), vec![])).await,
                self
            );
        }

        // Data
        Ok(try_smtp!(self.command(Data).await, self))
    }

    /// PATCH: the MAIL command for `envelope`, with the parameters `email` needs; the
    /// client-side refusals (SMTPUTF8, 8BITMIME) are its errors.
    fn mail_command(&self, envelope: &Envelope, email: &[u8]) -> Result<Mail, Error> {
        let mut mail_options = vec![];

        // Internationalization handling
        //
        // * 8BITMIME: https://tools.ietf.org/html/rfc6152
        // * SMTPUTF8: https://tools.ietf.org/html/rfc653

        // Check for non-ascii addresses and use the SMTPUTF8 option if any.
        if envelope.has_non_ascii_addresses() {
            if !self.server_info().supports_feature(Extension::SmtpUtfEight) {
                // don't try to send non-ascii addresses (per RFC)
                return Err(error::client(
                    "Envelope contains non-ascii chars but server does not support SMTPUTF8",
                ));
            }
            mail_options.push(MailParameter::SmtpUtfEight);
        }

        // Check for non-ascii content in the message
        if !email.is_ascii() {
            if !self.server_info().supports_feature(Extension::EightBitMime) {
                return Err(error::client(
                    "Message contains non-ascii chars but server does not support 8BITMIME",
                ));
            }
            mail_options.push(MailParameter::Body(MailBodyParameter::EightBitMime));
        }

        Ok(Mail::new(envelope.from().cloned(), mail_options))
    }

    /// PATCH: the envelope of a next transaction (MAIL, every RCPT, DATA) as one group of
    /// bytes, to be written behind the current message's end of data with
    /// [`Self::message_then`]; RFC 2920 lets message content start a pipelined group. `None`
    /// when the server does not advertise PIPELINING. The errors are `send_envelope`'s
    /// client-side refusals, before anything is written.
    pub fn next_envelope_group(
        &self,
        envelope: &Envelope,
        email: &[u8],
    ) -> Result<Option<Vec<u8>>, Error> {
        if !self.server_info.supports_feature(Extension::Pipelining) {
            return Ok(None);
        }
        let mail = self.mail_command(envelope, email)?;
        Ok(Some(envelope_group(mail, envelope).into_bytes()))
    }

    /// PATCH: the replies to an envelope group already written (`recipients` RCPTs), read and
    /// judged as [`Self::send_envelope`] says: one reply per command, in the order sent, the
    /// first refusal among MAIL and the RCPTs is the outcome, and after a refusal or a failed
    /// connection the connection is closed ([`Self::has_broken`]).
    pub async fn envelope_replies(&mut self, recipients: usize) -> Result<Response, Error> {
        // Every reply is read even after a refusal, so what the server says is never mistaken
        // for the reply to something else.
        let mut refusal = None;
        for _ in 0..=recipients {
            match self.read_response().await {
                Ok(_) => {}
                // A negative reply: the first one is the outcome.
                Err(err) if err.status().is_some() => {
                    refusal.get_or_insert(err);
                }
                // No reply at all (closed, unreadable): the conversation is over. A refusal
                // read before it is still the outcome, as it would have been sequentially.
                Err(err) => {
                    self.abort().await;
                    return Err(refusal.unwrap_or(err));
                }
            }
        }
        let data = self.read_response().await;
        match (refusal, data) {
            (None, Ok(response)) => Ok(response),
            (None, Err(err)) => {
                self.abort().await;
                Err(err)
            }
            (Some(err), Ok(_)) => {
                // The server is reading message content now: a QUIT would be taken as such.
                // Hanging up without the end of data abandons the transaction.
                self.panic = true;
                self.abort().await;
                Err(err)
            }
            (Some(err), Err(_)) => {
                self.abort().await;
                Err(err)
            }
        }
    }

    /// PATCH: whether the server hung up, or said something unasked (such as the `421` a
    /// relay sends before closing an idle connection), since the last reply. Answers at once,
    /// without a round trip: it only looks at what has already arrived. A connection for which
    /// this is true cannot start a transaction.
    pub fn has_unread_input(&mut self) -> bool {
        use futures_util::FutureExt as _;
        // Pending: nothing arrived, as on a quiet idle connection. Anything else is data, the
        // end of the stream or an error.
        self.stream.fill_buf().now_or_never().is_some()
    }

    pub fn has_broken(&self) -> bool {
        self.panic
    }

    pub fn can_starttls(&self) -> bool {
        !self.is_encrypted() && self.server_info.supports_feature(Extension::StartTls)
    }

    /// Upgrade the connection using `STARTTLS`.
    ///
    /// As described in [rfc3207]. Note that this mechanism has been deprecated in [rfc8314].
    ///
    /// [rfc3207]: https://www.rfc-editor.org/rfc/rfc3207
    /// [rfc8314]: https://www.rfc-editor.org/rfc/rfc8314
    #[allow(unused_variables)]
    pub async fn starttls(
        &mut self,
        tls_parameters: TlsParameters,
        hello_name: &ClientId,
    ) -> Result<(), Error> {
        if self.server_info.supports_feature(Extension::StartTls) {
            try_smtp!(self.command(Starttls).await, self);
            self.stream.get_mut().upgrade_tls(tls_parameters).await?;
            #[cfg(feature = "tracing")]
            tracing::debug!("connection encrypted");
            // Send EHLO again
            try_smtp!(self.ehlo(hello_name).await, self);
            Ok(())
        } else {
            Err(error::client("STARTTLS is not supported on this server"))
        }
    }

    /// Send EHLO and update server info
    async fn ehlo(&mut self, hello_name: &ClientId) -> Result<(), Error> {
        let ehlo_response = try_smtp!(self.command(Ehlo::new(hello_name.clone())).await, self);
        self.server_info = try_smtp!(ServerInfo::from_response(&ehlo_response), self);
        Ok(())
    }

    pub async fn quit(&mut self) -> Result<Response, Error> {
        Ok(try_smtp!(self.command(Quit).await, self))
    }

    pub async fn abort(&mut self) {
        // Only try to quit if we are not already broken
        if !self.panic {
            self.panic = true;
            let _ = self.command(Quit).await;
        }
        let _ = self.stream.close().await;
    }

    /// Sets the underlying stream
    #[allow(deprecated)]
    pub fn set_stream(&mut self, stream: AsyncNetworkStream) {
        self.stream = BufReader::new(stream);
    }

    /// Tells if the underlying stream is currently encrypted
    pub fn is_encrypted(&self) -> bool {
        self.stream.get_ref().is_encrypted()
    }

    /// Checks if the server is connected using the NOOP SMTP command
    pub async fn test_connected(&mut self) -> bool {
        self.command(Noop).await.is_ok()
    }

    /// Sends an AUTH command with the given mechanism, and handles the challenge if needed
    pub async fn auth(
        &mut self,
        mechanisms: &[Mechanism],
        credentials: &Credentials,
    ) -> Result<Response, Error> {
        let mechanism = self
            .server_info
            .get_auth_mechanism(mechanisms)
            .ok_or_else(|| error::client("No compatible authentication mechanism was found"))?;

        // Limit challenges to avoid blocking
        let mut challenges: u8 = 10;
        let mut response = self
            .command(Auth::new(mechanism, credentials.clone(), None)?)
            .await?;

        while challenges > 0 && response.has_code(334) {
            challenges -= 1;
            response = try_smtp!(
                self.command(Auth::new_from_response(
                    mechanism,
                    credentials.clone(),
                    &response,
                )?)
                .await,
                self
            );
        }

        if challenges == 0 {
            Err(error::response("Unexpected number of challenges"))
        } else {
            Ok(response)
        }
    }

    /// Sends the message content
    pub async fn message(&mut self, message: &[u8]) -> Result<Response, Error> {
        self.message_iter(std::iter::once(message)).await
    }

    /// PATCH: the message content, its end of data and `then` (a next transaction's envelope,
    /// see [`Self::next_envelope_group`]) in one write; reads the reply to the message only.
    pub async fn message_then(&mut self, message: &[u8], then: &[u8]) -> Result<Response, Error> {
        let mut codec = ClientCodec::new();
        let mut out_buf = Vec::with_capacity(message.len() + then.len() + 16);
        codec.encode(message, &mut out_buf);
        out_buf.extend_from_slice(b"\r\n.\r\n");
        out_buf.extend_from_slice(then);
        self.write(out_buf.as_slice()).await?;

        self.read_response().await
    }

    /// Sends the message content by consuming an iterator that in its whole represents a message.
    pub async fn message_iter<I, B>(&mut self, message: I) -> Result<Response, Error>
    where
        I: Iterator<Item = B>,
        B: AsRef<[u8]>,
    {
        // PATCH: the content and the end of data in one write. As two, the 5-byte end of data
        // waited under Nagle's algorithm for the content's ACK, which a relay delays (~40 ms).
        let mut codec = ClientCodec::new();
        let mut out_buf = Vec::new();
        for message_part in message {
            codec.encode(message_part.as_ref(), &mut out_buf);
        }
        out_buf.extend_from_slice(b"\r\n.\r\n");
        self.write(out_buf.as_slice()).await?;

        self.read_response().await
    }

    /// Sends an SMTP command
    pub async fn command<C: Display>(&mut self, command: C) -> Result<Response, Error> {
        self.write(command.to_string().as_bytes()).await?;
        self.read_response().await
    }

    /// Writes a string to the server
    async fn write(&mut self, string: &[u8]) -> Result<(), Error> {
        self.stream
            .get_mut()
            .write_all(string)
            .await
            .map_err(error::network)?;
        self.stream
            .get_mut()
            .flush()
            .await
            .map_err(error::network)?;

        #[cfg(feature = "tracing")]
        tracing::debug!("Wrote: {}", escape_crlf(&String::from_utf8_lossy(string)));
        Ok(())
    }

    /// Gets the SMTP response
    pub async fn read_response(&mut self) -> Result<Response, Error> {
        let mut buffer = String::with_capacity(100);
        let mut pre = 0;

        while self
            .stream
            .read_line(&mut buffer)
            .await
            .map_err(error::network)?
            > 0
        {
            if buffer.len() - pre > MAX_RESPONSE_LINE_BYTES {
                return Err(error::response("SMTP response line too long"));
            }
            if buffer.len() > MAX_RESPONSE_BYTES {
                return Err(error::response("SMTP response too large"));
            }
            pre = buffer.len();

            #[cfg(feature = "tracing")]
            tracing::debug!("<< {}", escape_crlf(&buffer));
            match parse_response(&buffer) {
                Ok((_remaining, response)) => {
                    return if response.is_positive() {
                        Ok(response)
                    } else {
                        Err(error::code_from_response(&response))
                    };
                }
                Err(nom::Err::Failure(e)) => {
                    return Err(error::response(e.to_string()));
                }
                Err(nom::Err::Incomplete(_)) => { /* read more */ }
                Err(nom::Err::Error(e)) => {
                    return Err(error::response(e.to_string()));
                }
            }
        }

        Err(error::response("incomplete response"))
    }

    /// The X509 certificate of the server (DER encoded)
    #[cfg(any(feature = "native-tls", feature = "rustls", feature = "boring-tls"))]
    #[cfg_attr(
        docsrs,
        doc(cfg(any(feature = "native-tls", feature = "rustls", feature = "boring-tls")))
    )]
    pub fn peer_certificate(&self) -> Result<Vec<u8>, Error> {
        self.stream.get_ref().peer_certificate()
    }

    /// Currently this is only avaialable when using Boring TLS and
    /// returns the result of the verification of the TLS certificate
    /// presented by the peer, if any. Only the last error encountered
    /// during verification is presented.
    /// It can be useful when you don't want to fail outright the TLS
    /// negotiation, for example when a self-signed certificate is
    /// encountered, but still want to record metrics or log the fact.
    /// When using DANE verification, the PKI root of trust moves from
    /// the CAs to DNS, so self-signed certificates are permitted as long
    /// as the TLSA records match the leaf or issuer certificates.
    /// It cannot be called on non Boring TLS streams.
    #[cfg(feature = "boring-tls")]
    #[cfg_attr(docsrs, doc(cfg(feature = "boring-tls")))]
    pub fn tls_verify_result(&self) -> Result<(), Error> {
        self.stream.get_ref().tls_verify_result()
    }

    /// All the X509 certificates of the chain (DER encoded)
    #[cfg(any(feature = "rustls", feature = "boring-tls"))]
    #[cfg_attr(docsrs, doc(cfg(any(feature = "rustls", feature = "boring-tls"))))]
    pub fn certificate_chain(&self) -> Result<Vec<Vec<u8>>, Error> {
        self.stream.get_ref().certificate_chain()
    }
}

/// PATCH: MAIL, one RCPT per recipient and DATA as one pipelined group (RFC 2920).
fn envelope_group(mail: Mail, envelope: &Envelope) -> String {
    let mut group = mail.to_string();
    for to_address in envelope.to() {
        group.push_str(&Rcpt::new(to_address.clone(), vec![]).to_string());
    }
    group.push_str(&Data.to_string());
    group
}
