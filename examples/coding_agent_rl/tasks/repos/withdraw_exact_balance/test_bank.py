import unittest

from bank import Account, InsufficientFunds


class AccountTest(unittest.TestCase):
    def test_partial(self):
        account = Account(100)
        account.withdraw(30)
        self.assertEqual(account.balance, 70)

    def test_exact_balance(self):
        account = Account(100)
        account.withdraw(100)
        self.assertEqual(account.balance, 0)

    def test_overdraft(self):
        with self.assertRaises(InsufficientFunds):
            Account(10).withdraw(11)


if __name__ == "__main__":
    unittest.main()
