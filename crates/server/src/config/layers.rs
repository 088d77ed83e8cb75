//! How fencelockd's settings are declared once and layered: the
//! `declare_settings!` macro that turns one declaration per concern into
//! its flags, environment variables, TOML keys and help, and the two
//! traits the layering needs ([`Layer`]: one layer over another,
//! [`FileValue`]: a value read from the file, checked under its key).
//! What the settings are is `settings.rs`'s; what they mean together is
//! `config.rs`'s.

use anyhow::Result;

/// One layer of settings over a lower one: flags and environment over the
/// file. Each setting is taken from the upper layer if it has one.
pub trait Layer {
    fn or(self, lower: Self) -> Self;
}

impl<T> Layer for Option<T> {
    fn or(self, lower: Self) -> Self {
        Option::or(self, lower)
    }
}

/// A list given at all replaces a lower one (`--lock-delay` replaces the
/// file's `[lock_delay]` table).
impl<T> Layer for Vec<T> {
    fn or(self, lower: Self) -> Self {
        if self.is_empty() {
            lower
        } else {
            self
        }
    }
}

/// A switch is on if any layer turns it on (`--insecure`, or
/// `insecure = true` in the file).
impl Layer for bool {
    fn or(self, lower: Self) -> Self {
        self || lower
    }
}

/// A value as the file gives it, checked once its key is known, so that
/// the error names the key (`tick_ms: ...`). Every value the file gives is
/// checked, whether a flag overrides it or not. Most values are taken as
/// they are; see `settings.rs` for the ones that are not.
pub trait FileValue: Sized {
    fn checked(self, _key: &str) -> Result<Self> {
        Ok(self)
    }
}

impl<T: FileValue> FileValue for Option<T> {
    fn checked(self, key: &str) -> Result<Self> {
        self.map(|value| value.checked(key)).transpose()
    }
}

/// Declares every setting, grouped by concern, each once: its doc (the
/// help), its `#[arg]` (flag, environment variable, parser), its optional
/// `#[serde]` (how the file spells it), its type in a layer, and after `=`
/// its default as `--help` shows it. From that it makes:
///
/// - one struct per concern, deriving `clap::Args`, and `Settings`, which
///   flattens them all: one layer of settings (flags and environment);
/// - `File`, the TOML file: every setting at the top level under its field
///   name, unknown keys refused, and `File::into_settings`, the file as a
///   layer of the same type;
/// - `Settings::or`, one layer over another, field by field ([`Layer`]);
/// - `Settings::KEYS`, every key the file takes (for the tests);
/// - `Settings::with_default`, which appends `[default: ...]` to the help
///   of each setting declared with a default.
macro_rules! declare_settings {
    (
        $(
            $(#[doc = $doc:literal])*
            $concern:ident: $Concern:ident {
                $(
                    $(#[doc = $field_doc:literal])*
                    #[arg($($arg:tt)*)]
                    $(#[serde($($serde:tt)*)])?
                    $field:ident: $ty:ty $(= $default:expr)?,
                )*
            }
        )*
    ) => {
        $(
            $(#[doc = $doc])*
            #[derive(Clone, Debug, Default, clap::Args)]
            pub struct $Concern {
                $(
                    $(#[doc = $field_doc])*
                    #[arg($($arg)*)]
                    pub $field: $ty,
                )*
            }
        )*

        /// One layer of settings, every concern's: the flags and the
        /// environment, or the file.
        #[derive(Clone, Debug, Default, clap::Args)]
        #[command(mut_args = Settings::with_default)]
        pub struct Settings {
            $(
                #[command(flatten)]
                pub $concern: $Concern,
            )*
        }

        impl Settings {
            /// Every key the TOML file takes.
            #[cfg(test)]
            pub const KEYS: &'static [&'static str] = &[$($(stringify!($field),)*)*];

            /// This layer over `lower`: each setting this one lacks is
            /// taken from `lower`.
            pub fn or(self, lower: Settings) -> Settings {
                Settings {
                    $(
                        $concern: $Concern {
                            $(
                                $field: $crate::config::layers::Layer::or(
                                    self.$concern.$field,
                                    lower.$concern.$field,
                                ),
                            )*
                        },
                    )*
                }
            }

            /// The default of the setting `id` as `--help` shows it, for
            /// those declared with one.
            pub fn default_text(id: &str) -> Option<String> {
                $($($(
                    if id == stringify!($field) {
                        return Some($default.to_string());
                    }
                )?)*)*
                None
            }

            /// `arg` with its default, if it has one, at the end of its help.
            fn with_default(arg: clap::Arg) -> clap::Arg {
                match Settings::default_text(arg.get_id().as_str()) {
                    Some(text) => {
                        let help = arg.get_help().map(ToString::to_string).unwrap_or_default();
                        arg.help(format!("{help}. [default: {text}]"))
                    }
                    None => arg,
                }
            }
        }

        /// The TOML file: every setting at the top level, under the name of
        /// its field.
        #[derive(Debug, Default, serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        pub struct File {
            $($(
                $(#[serde($($serde)*)])?
                $field: $ty,
            )*)*
        }

        impl File {
            /// The file as a layer, each value checked under its key.
            pub fn into_settings(self) -> anyhow::Result<Settings> {
                Ok(Settings {
                    $(
                        $concern: $Concern {
                            $(
                                $field: $crate::config::layers::FileValue::checked(
                                    self.$field,
                                    stringify!($field),
                                )?,
                            )*
                        },
                    )*
                })
            }
        }
    };
}

pub(crate) use declare_settings;
