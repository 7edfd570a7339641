#!/usr/bin/perl
# A tiny in-memory key-value server for tests/apply_servers.rs: one process,
# one thread, reads with sysread, answers every command, and keeps all its
# state in memory. `perl kv.pl select PORT` waits in select(2) (IO::Select),
# `perl kv.pl poll PORT` in poll(2) (IO::Poll).
#
# Commands (one per line):
#   APPEND key value  -> OK <seq> <new length>
#   INCR key          -> OK <seq> <new value>
#   DEL key           -> OK <seq> <1|0>
#   GET key           -> VALUE <value> | NIL
#   DUMP              -> KEY <key> <value> ... (sorted), then END <seq> <keys>
# <seq> counts the commands that changed the state, across connections, so
# every reply depends on the order of all inputs before it.
use strict;
use warnings;
use IO::Socket::INET;

my ($mode, $port) = @ARGV;
die "usage: kv.pl select|poll PORT\n" unless defined $port && $mode =~ /^(select|poll)$/;
$SIG{PIPE} = 'IGNORE';

my $listener = IO::Socket::INET->new(
    LocalAddr => '127.0.0.1',
    LocalPort => $port,
    Listen    => 128,
    ReuseAddr => 1,
    Proto     => 'tcp',
) or die "listen on $port: $!\n";

my %data;
my $seq = 0;
my %inbuf;    # fileno -> unread bytes
my %socks;    # fileno -> socket
my $conns = 0;

sub command {
    my ($line) = @_;
    my ($cmd, $key, $value) = split / /, $line, 3;
    $cmd = '' unless defined $cmd;
    if ($cmd eq 'APPEND' && defined $value) {
        $data{$key} = '' unless defined $data{$key};
        $data{$key} .= $value;
        $seq++;
        return "OK $seq " . length($data{$key}) . "\n";
    }
    if ($cmd eq 'INCR' && defined $key) {
        $data{$key} = ($data{$key} || 0) + 1;
        $seq++;
        return "OK $seq $data{$key}\n";
    }
    if ($cmd eq 'DEL' && defined $key) {
        my $had = exists $data{$key} ? 1 : 0;
        delete $data{$key};
        $seq++;
        return "OK $seq $had\n";
    }
    if ($cmd eq 'GET' && defined $key) {
        return defined $data{$key} ? "VALUE $data{$key}\n" : "NIL\n";
    }
    if ($cmd eq 'DUMP') {
        my $out = '';
        $out .= "KEY $_ $data{$_}\n" for sort keys %data;
        return $out . "END $seq " . scalar(keys %data) . "\n";
    }
    return "ERR unknown command\n";
}

sub reply {
    my ($sock, $out) = @_;
    while (length $out) {
        my $n = syswrite($sock, $out);
        return 0 unless defined $n;
        substr($out, 0, $n) = '';
    }
    return 1;
}

# Reads what is there on a readable client; false once it is gone.
sub serve {
    my ($sock) = @_;
    my $fd = fileno $sock;
    my $n = sysread($sock, my $buf, 65536);
    return 0 unless $n;
    $inbuf{$fd} .= $buf;
    my $out = '';
    while ($inbuf{$fd} =~ s/^([^\n]*)\n//) {
        my $line = $1;
        $line =~ s/\r$//;
        $out .= command($line);
    }
    return length($out) ? reply($sock, $out) : 1;
}

sub accept_one {
    my $c = $listener->accept or return undef;
    $conns++;
    $socks{fileno $c} = $c;
    $inbuf{fileno $c} = '';
    return $c;
}

sub drop_conn {
    my ($c) = @_;
    my $fd = fileno $c;
    delete $socks{$fd};
    delete $inbuf{$fd};
    close $c;
}

print STDERR "kv ($mode) listening on 127.0.0.1:$port\n";

if ($mode eq 'select') {
    require IO::Select;
    my $sel = IO::Select->new($listener);
    while (1) {
        for my $s ($sel->can_read) {
            if ($s == $listener) {
                my $c = accept_one() or next;
                $sel->add($c);
            } elsif (!serve($s)) {
                $sel->remove($s);
                drop_conn($s);
            }
        }
    }
} else {
    require IO::Poll;
    IO::Poll->import(qw(POLLIN POLLHUP POLLERR));
    my $poll = IO::Poll->new;
    $poll->mask($listener => POLLIN());
    while (1) {
        $poll->poll;
        for my $s ($poll->handles(POLLIN() | POLLHUP() | POLLERR())) {
            if ($s == $listener) {
                my $c = accept_one() or next;
                $poll->mask($c => POLLIN());
            } elsif (!serve($s)) {
                $poll->remove($s);
                drop_conn($s);
            }
        }
    }
}
