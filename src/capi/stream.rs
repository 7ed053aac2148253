//! Token streaming in the C ABI: the caller's `on_token` callback, fed by greedy search
//! for token calls (the token) and text calls (also the sentence's translation so far).
use std::ffi::{c_char, c_void, CString};
use std::ptr;
use std::sync::Arc;

use crate::{TextTokenCallback, TextTokenEvent, TokenCallback, TokenEvent};

/// What `on_token` receives for each generated token. Valid during the call only.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct TolkTokenEvent {
    /// sizeof(TolkTokenEvent) in the library that calls (fields may be added at the end).
    pub struct_size: u32,
    /// The token's id in the target vocabulary.
    pub token_id: u32,
    /// Token calls: index of the sentence in the batch. Text calls: index of the text.
    pub index: usize,
    /// Text calls: index of the sentence in its text's result (tolk_text_result_sentence);
    /// token calls: 0.
    pub sentence: usize,
    /// Position of the token among the generated ones (0 = the first after any prefix).
    pub step: usize,
    /// The token (NUL-terminated UTF-8).
    pub token: *const c_char,
    /// Text calls: the sentence's translation so far, detokenized (UTF-8, `text_length`
    /// bytes, NUL-terminated); token calls: NULL.
    pub text: *const c_char,
    pub text_length: usize,
    /// The sentence's translation ends with this token.
    pub is_last: bool,
}

/// See TolkTranslateOptions.on_token: return false to end this sentence's translation here.
pub type TolkTokenCallback = Option<unsafe extern "C" fn(user_data: *mut c_void, event: *const TolkTokenEvent) -> bool>;

/// A caller's token callback and its user data.
#[derive(Clone, Copy)]
pub(super) struct TokenSink {
    pub callback: TolkTokenCallback,
    pub user_data: *mut c_void,
}

// SAFETY: the callback runs on the translator's workers; TolkTranslateOptions.on_token
// documents that the caller's function and data must allow that.
unsafe impl Send for TokenSink {}
unsafe impl Sync for TokenSink {}

impl TokenSink {
    fn call(&self, event: &TolkTokenEvent) -> bool {
        // SAFETY: the caller vouches for its callback and user data (see above).
        self.callback.is_none_or(|f| unsafe { f(self.user_data, event) })
    }

    fn event(token_id: u32, index: usize, sentence: usize, step: usize, is_last: bool) -> TolkTokenEvent {
        TolkTokenEvent {
            struct_size: std::mem::size_of::<TolkTokenEvent>() as u32,
            token_id,
            index,
            sentence,
            step,
            token: ptr::null(),
            text: ptr::null(),
            text_length: 0,
            is_last,
        }
    }

    /// The callback of a token call, if the caller set one.
    pub fn batch_callback(self) -> Option<TokenCallback> {
        self.callback?;
        Some(Arc::new(move |e: &TokenEvent| {
            let token = c_string(e.token);
            let mut event = TokenSink::event(e.id, e.example, 0, e.step, e.is_last);
            event.token = token.as_ptr();
            self.call(&event)
        }))
    }

    /// The callback of a text call, if the caller set one.
    pub fn text_callback(self) -> Option<TextTokenCallback> {
        self.callback?;
        Some(Arc::new(move |e: &TextTokenEvent| {
            let token = c_string(e.token);
            let text = c_string(e.translation);
            let mut event = TokenSink::event(e.id, e.text, e.sentence, e.step, e.is_last);
            event.token = token.as_ptr();
            event.text = text.as_ptr();
            event.text_length = text.as_bytes().len();
            self.call(&event)
        }))
    }
}

fn c_string(s: &str) -> CString {
    CString::new(s.replace('\0', "")).unwrap_or_default()
}
